"""Bandwidth model of trainer -> inference weight synchronisation (paper Fig. 1/13), built from
what one pulse-train run measured.

Measured in the file (sums over the steps of /steps/*, N_run = the num_parameters attribute):
  changed fraction   c   = 1 - mean(sparsity)             (or 1 - the --sparsity override)
  patch bits/changed b   = 8 * sum(patch_bytes) / sum(changed)
  dense bytes/param  d   = sum(dense_bytes) / (rows * N_run)        (2 for BF16)
  encode rate        R_e = N_run / mean(encode_s)            parameters per second
  apply rate         R_a = N_run / mean(apply_s)             parameters per second (slowest rank)
R_e and R_a are the speeds of the machine and code that made the run (pulse's CPU codec there);
--encode-rate and --apply-rate replace them with another device's speeds.
Scaled to a model of N parameters (the assumption: sparsity and bits per changed element do not
depend on size, which the paper reports for 0.5B-7B):
  S_patch = c * N * b / 8 bytes,   S_dense = d * N bytes
  T_patch(B) = N / R_e + 8 * S_patch / B + N / R_a          (B: link bandwidth in bit/s)
  T_dense(B) = 8 * S_dense / B                              (the weights are sent as they are)
  winner(B)  = argmin over {dense, patch};  crossover B* = 8 (S_dense - S_patch) / (N/R_e + N/R_a)
GPU utilisation with compute time T_c per step and a synchronisation that does not overlap
compute (the inference GPUs wait for the new weights every step):
  U(B) = T_c / (T_c + min(T_dense(B), T_patch(B)))   (and per codec with its own T)
"""
import numpy as np


class Model:
    def __init__(self, run, params=None, compute_s=None, sparsity=None, encode_rate=None, apply_rate=None):
        s = run.steps
        n_run = int(run.attrs["num_parameters"])
        changed = float(np.sum(s["changed"]))
        self.run = run.name
        self.params = float(params) if params else float(n_run)
        self.sparsity = float(sparsity) if sparsity is not None else float(np.mean(s["sparsity"]))
        self.bits_per_changed = 8.0 * float(np.sum(s["patch_bytes"])) / changed if changed else 0.0
        self.dense_bytes_per_param = float(np.sum(s["dense_bytes"])) / (run.rows * n_run)
        self.encode_rate = float(encode_rate) if encode_rate else n_run / float(np.mean(s["encode_s"]))
        self.apply_rate = float(apply_rate) if apply_rate else n_run / float(np.mean(s["apply_s"]))
        given = [f"{what} {rate:.3g} parameters/s (given)" for what, rate, g in
                 (("encode", self.encode_rate, encode_rate), ("apply", self.apply_rate, apply_rate)) if g]
        measured = [f"{what} {rate:.3g} parameters/s (measured in {run.name}, pulse-train's codec on that machine)"
                    for what, rate, g in (("encode", self.encode_rate, encode_rate),
                                          ("apply", self.apply_rate, apply_rate)) if not g]
        self.speed_source = "; ".join(given + measured)
        # compute time per step: the run's step time without the patch's coding (sync_s; the local send and the
        # waits for the inference rank stay in: a step's own time), unless given
        self.compute_s = float(compute_s) if compute_s else float(np.mean(s["step_s"] - s["sync_s"]))

    @property
    def patch_bytes(self):
        return (1.0 - self.sparsity) * self.params * self.bits_per_changed / 8.0

    @property
    def dense_bytes(self):
        return self.dense_bytes_per_param * self.params

    @property
    def codec_s(self):
        return self.params / self.encode_rate + self.params / self.apply_rate

    def sync_s(self, bandwidth_bps):
        """(dense, patch) seconds per step at link bandwidth(s) in bit/s."""
        b = np.asarray(bandwidth_bps, dtype=float)
        return 8.0 * self.dense_bytes / b, self.codec_s + 8.0 * self.patch_bytes / b

    def utilisation(self, sync_s):
        return self.compute_s / (self.compute_s + np.asarray(sync_s))

    @property
    def crossover_bps(self):
        saved = self.dense_bytes - self.patch_bytes
        return 8.0 * saved / self.codec_s if saved > 0 else float("inf")

    def table(self, bandwidths_bps):
        rows = []
        dense, patch = self.sync_s(bandwidths_bps)
        for b, td, tp in zip(bandwidths_bps, dense, patch):
            best = min(td, tp)
            rows.append({"bandwidth_gbps": b / 1e9, "dense_s": td, "patch_s": tp,
                         "winner": "patch" if tp < td else "dense", "sync_s": best,
                         "utilisation_dense": float(self.utilisation(td)),
                         "utilisation_patch": float(self.utilisation(tp)),
                         "utilisation": float(self.utilisation(best))})
        return rows
