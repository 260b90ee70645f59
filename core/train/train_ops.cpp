// The training ops' builds, by instruction set (train_ops.hpp): one KernelTable per scalar type,
// as fast_attention.cpp's and gemm.cpp's, filled with the tables train_ops_ref.cpp ends with.
#include "core/train/train_ops.hpp"

#include "core/base/parallel.hpp"
#include "core/cpu/gemm.hpp"

namespace vitlens::train {

void parallel_for(int tasks, int threads, const std::function<void(int)>& task) { run_tasks(tasks, threads, task); }

const char* train_ops_isa() { return kernel_isa_id(kernel_isa()); }

int train_ops_k_block() { return detail::kGemmKernels.get(kernel_isa()).kc; }

// The tables of the three builds of train_ops_ref.cpp (the vector ones on x86-64 only).
#define VITLENS_TRAIN_BUILD(isa)                 \
  namespace isa {                                \
  extern const TrainOps<float> kFloatOps;        \
  extern const TrainOps<double> kDoubleOps;      \
  }
VITLENS_TRAIN_BUILD(portable)
VITLENS_TRAIN_BUILD(avx2)
VITLENS_TRAIN_BUILD(avx512)
#undef VITLENS_TRAIN_BUILD

namespace {
const KernelTable<TrainOps<float>> kFloatTable{&portable::kFloatOps, VITLENS_X86_TABLE(avx2::kFloatOps),
                                               VITLENS_X86_TABLE(avx512::kFloatOps)};
const KernelTable<TrainOps<double>> kDoubleTable{&portable::kDoubleOps, VITLENS_X86_TABLE(avx2::kDoubleOps),
                                                 VITLENS_X86_TABLE(avx512::kDoubleOps)};
}  // namespace

template <>
const TrainOps<float>& train_ops<float>() {
  return kFloatTable.active();
}
template <>
const TrainOps<double>& train_ops<double>() {
  return kDoubleTable.active();
}

}  // namespace vitlens::train
