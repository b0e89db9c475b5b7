"""pulse_analysis: figures and tables from pulse's outputs (Debian's python3 with numpy, h5py and
matplotlib).
    python3 -m pulse_analysis absorb absorption.json -o DIR
    python3 -m pulse_analysis report RUN.h5 [RUN2.h5 ...] -o DIR [--params N] [--encode-rate R] ..."""
import argparse
import sys

from . import absorb


def main():
    parser = argparse.ArgumentParser(prog="python3 -m pulse_analysis")
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("absorb", help="figures and table of a pulse-absorb run")
    a.add_argument("json", help="absorption.json written by pulse-absorb")
    a.add_argument("-o", "--out", required=True, help="output folder")
    r = sub.add_parser("report", help="figures and tables of pulse-train statistics files")
    r.add_argument("files", nargs="+", help="RUN.h5 files written by pulse-train")
    r.add_argument("-o", "--out", required=True, help="output folder")
    bw = r.add_argument_group("bandwidth model (formulas in pulse_analysis/bandwidth.py; measured in the first file)")
    bw.add_argument("--params", type=float, help="model size in parameters (default: the file's num_parameters)")
    bw.add_argument("--compute-s", type=float, help="compute seconds per step (default: the run's step_s - sync_s)")
    bw.add_argument("--sparsity", type=float, help="per-step sparsity to assume, 0..1 (default: the measured mean)")
    bw.add_argument("--encode-rate", type=float,
                    help="patch encode speed in parameters/s of the device to model (default: measured in the file)")
    bw.add_argument("--apply-rate", type=float,
                    help="patch apply speed in parameters/s of the device to model (default: measured in the file)")
    bw.add_argument("--bandwidth-gbps", default="0.1,1,10,100,400",
                    help="comma-separated link bandwidths in Gbit/s for bandwidth.csv (default %(default)s)")
    args = parser.parse_args()
    if args.command == "absorb":
        for row in absorb.write_report(args.json, args.out):
            print(f"k={row['k']:>2}: mean {100 * row['mean_sparsity']:.3f}%  min {100 * row['min_sparsity']:.3f}%"
                  f"  over {row['steps']} steps")
    else:
        from . import report

        try:
            bws = [float(x) for x in args.bandwidth_gbps.split(",")]
            out = report.write_report(args.files, args.out, params=args.params, compute_s=args.compute_s,
                                      sparsity=args.sparsity, bandwidths_gbps=bws, encode_rate=args.encode_rate,
                                      apply_rate=args.apply_rate)
        except (ValueError, OSError) as e:
            sys.exit(f"pulse_analysis report: {e}")
        for row in out["summary"]:
            print(f"{row['run']}: {row['steps']} steps, mean sparsity {100 * row['mean_sparsity']:.3f}%, "
                  f"min {100 * row['min_sparsity']:.3f}%, patch {row['compression_vs_dense']:.1f}x smaller than dense")
        for p in out["predictions"]:
            print(p.statement())
        print(f"wrote {args.out}/summary.md, summary.csv and {len(out['written'])} figures")


main()
