// Casts FP32 values to BF16 with pulse's kernel: cast_driver IN.f32 OUT.u16
#include <Kokkos_Core.hpp>
#include <iostream>

#include "kernels/bf16.hpp"
#include "kernels/host_copy.hpp"
#include "raw_io.hpp"

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  if (argc != 3) {
    std::cerr << "usage: cast_driver IN.f32 OUT.u16\n";
    return 2;
  }
  try {
    const auto in = pulse::oracle::read_raw<float>(argv[1]);
    Kokkos::View<pulse::bf16_bits*> out("out", in.size());
    pulse::cast_to_bf16(pulse::DefaultExec(), pulse::to_device(in), out);
    pulse::oracle::write_raw(argv[2], pulse::to_host(out));
  } catch (const std::exception& e) {
    std::cerr << "cast_driver: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
