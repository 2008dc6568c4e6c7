//===- apc/cost/device.h - Device table for the compute roofline ----------===//
//
// A DeviceSpec describes one accelerator kind for the cost model: dense peak throughput per dtype
// (TFLOPS, tensor cores where the device has them), HBM bandwidth, the fractions of those peaks
// that real kernels reach, and a per-kernel floor (launch and tail overhead) in microseconds.
// Built-in specs (h100, h200, a100, b200, cpu) use public datasheet numbers for the SXM parts,
// dense (no 2:4 sparsity); they are estimates for ranking plans, not predictions of wall time. A
// spec can be adjusted from the command line through DeviceOverrides.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <array>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "apc/ir/types.h"
#include "apc/support/error.h"

namespace apc::cost {

/// Dense peak throughput in TFLOPS (1e12 operations per second) per arithmetic type.
struct PeakTflops {
  double f64 = 0;   // FP64 (tensor core where available)
  double f32 = 0;   // FP32 without TF32 (CUDA cores)
  double tf32 = 0;  // TF32 tensor cores (used for f32 only when DeviceSpec::f32_uses_tf32)
  double bf16 = 0;  // BF16 tensor cores
  double f16 = 0;   // FP16 tensor cores
  double i8 = 0;    // INT8 tensor cores (TOPS)
};

/// Measured kernel times by work (ascending): x is flops (matmul) or bytes (elementwise).
struct KernelCurve {
  std::vector<double> x;
  std::vector<double> us;
  bool empty() const { return x.size() < 2 || x.size() != us.size(); }
};

struct DeviceSpec {
  std::string name;     // "h100", ...
  PeakTflops peak;      // dense peaks
  double hbm_gbps = 0;  // memory bandwidth in GB/s (1e9 bytes per second)
  /// Memory per device in GB (1e9 bytes); 0 unknown (the "cpu" entry: a host's memory is its
  /// own and shared). `apc plan` with a named device plans to fit it by default.
  double memory_gb = 0;
  double compute_efficiency = 0.7;  // fraction of peak FLOPS reached by real kernels, in (0, 1]
  double memory_efficiency = 0.8;   // fraction of HBM bandwidth reached by real kernels, in (0, 1]
  double kernel_floor_us = 2.0;     // least time of any kernel that does work (launch, tail)
  /// Host time to dispatch one op node (the runtime's interpreter, the dispatcher, autograd),
  /// paid by every op, views included, forward and again backward when it takes a gradient.
  /// The same for every strategy of a node, so it moves predictions, not choices. 0 in the
  /// built-in devices; apc calibrate measures it.
  double dispatch_us = 0.0;
  /// Whether the host dispatches ahead of the device (CUDA: kernels queue on a stream and run while
  /// the host dispatches the next ops), so that an op pass costs the larger of its dispatch and
  /// its kernels, not their sum (CostModel::passUs). False on the CPU, where the dispatching
  /// thread runs the kernels.
  bool dispatch_overlaps = false;
  /// Host time of a node whose op runs no kernel (views, list construction) per pass; unset:
  /// dispatch_us. apc calibrate measures it (a chain of views); on an H200 host 5 us against a
  /// mixed op's 17, and views are a third of a transformer's nodes.
  std::optional<double> view_dispatch_us;
  /// The share of a collective's time that compute running beside it does not pay, in [0, 1]:
  /// 1 where communication has engines of its own (a GPU's copy engines and NVLink), about 0 on
  /// CPU ranks whose Gloo threads reduce and copy on the cores that compute. The step prediction
  /// takes this share of the communication the overlap schedule hides off the step
  /// (apc/lower/schedule.h). apc calibrate measures it (a matmul loop with and without an
  /// all-reduce in flight).
  double overlap_efficiency = 1.0;
  /// Compute time a rank loses after each blocking collective call it waits for: the kernels that
  /// follow a wait run slower than back to back (on a shared CPU VM the waiting core goes idle and
  /// comes back cold). CostModel::collectiveUs adds it to every collective call. 0 in the built-in
  /// datasheet devices; apc calibrate measures it (a chain of kernels back to back and right after
  /// a small blocking all-reduce): 45-100 us on this project's 2-core VM, on chains of 0.15-2 ms.
  double wait_resume_us = 0.0;
  /// What a contraction's output costs beyond its flops, as a write rate in GB/s (0: nothing):
  /// a GEMM's microkernel loads and stores each output tile once per pass over the inner dim, so
  /// where that dim is small the outputs, not the flops, set the time. On a CPU core an f32
  /// [512,48] x [48,25129] product took 2.7 times a square one of the same flops (36.7 ms against
  /// 13.5). apc calibrate measures it (an inner dim of 16 against a square product); the matmul
  /// curve, measured on square products, prices the flops.
  double matmul_output_gbps = 0.0;
  /// Products with a dim of one run as BLAS level-2 kernels, bound by their bytes, not their flops
  /// (0: priced as any product). A matrix-vector product (a per-matrix M or N of one) reads its
  /// matrix at `matvec_gbps`; an outer product (an inner dim of one) writes its output at
  /// `outer_product_gbps`. On a CPU core a batched matvec [512,256,64] x [512,64,1] (Hugging Face's
  /// batched_mm experts) took 7.4 ms, 4.5 GB/s of matrix, where its flops at the square products'
  /// rate take 0.2 ms; its weight gradient, an outer product per matrix, wrote 1.5 GB/s. apc
  /// calibrate measures both (a batched matvec and a batched outer product).
  double matvec_gbps = 0.0;
  double outer_product_gbps = 0.0;
  /// What a convolution costs beyond its flops per byte of its (local) weight, as rates in GB/s
  /// (0: nothing): forward, and backward where the weight takes a gradient. oneDNN's CPU
  /// convolutions reorder the weight into a blocked layout on every call and, where the output's
  /// spatial size is small, accumulate the weight gradient in passes over the whole weight: on a
  /// CPU core torchvision's resnet18 at 64x64 (a 512->512 3x3 conv on 2x2 maps, 9.4 MB of weight)
  /// took 1.5 ms forward and 5.9 backward where its flops at the measured conv rate take 0.5
  /// and 1.1 ms; the 64-channel convs on 16x16 maps ran at that rate. apc calibrate measures both
  /// (3x3 convs on 2x2 maps of 64-512 channels against the conv curve).
  double conv_weight_gbps = 0.0;
  double conv_weight_grad_gbps = 0.0;
  /// Measured times (apc calibrate) that replace the roofline where present (CostModel): per
  /// dtype the matmul time by flops, for contractions and attention; the convolution time by
  /// flops, for convolutions (else the matmul curve); the scaled_dot_product_attention time by
  /// flops, for attention (else the matmul curve); the elementwise time by bytes, for every
  /// other kernel that moves memory. Each is the forward's share of a measured forward and
  /// backward (the time of both over 1 + the family's backward multiplier).
  std::map<ir::DType, KernelCurve> matmul_curve;
  std::map<ir::DType, KernelCurve> conv_curve;
  std::map<ir::DType, KernelCurve> attention_curve;
  /// Single ops' forward kernels by their work's bytes (spec::DeviceOverrides::op_us), f32: what
  /// the elementwise curve misses (tanh takes 30 times an add of its bytes on a CPU core).
  std::map<std::string, KernelCurve> op_curves;
  KernelCurve elementwise_curve;
  /// Measured op nodes by strategy::nodeTimeKey (spec::DeviceOverrides::node_us): {forward pass,
  /// backward pass} in us, dispatch included. They replace the whole model of a node with that key:
  /// kernels whose time no curve of flops or bytes describes (a depthwise 5x5 convolution's weight
  /// gradient took 1.9 ms on a CPU core for 0.9 MFLOP, 30 times a dense convolution's rate).
  std::map<std::string, std::array<double, 2>> node_us;
  bool f32_uses_tf32 = false;  // price f32 work at the TF32 peak (torch allow_tf32)

  /// Peak TFLOPS used for work in `dtype`: f64, f32 (or tf32), bf16, f16 as named; i8/u8 at the
  /// INT8 peak; other integer types, bool and unknown at the f32 peak.
  double peakTflops(ir::DType dtype) const;
};

/// Names of the built-in devices, sorted: a100, b200, cpu, h100, h200.
std::vector<std::string> deviceNames();

/// The built-in spec named `name` (case-insensitive); an unknown name is a kNotFound error that
/// lists the known names.
Expected<DeviceSpec> deviceByName(std::string_view name);

/// Optional adjustments of a spec; unset fields keep the spec's value.
struct DeviceOverrides {
  std::optional<double> peak_f64, peak_f32, peak_tf32, peak_bf16, peak_f16, peak_i8;  // TFLOPS > 0
  std::optional<double> hbm_gbps;                                                     // > 0
  std::optional<double> compute_efficiency, memory_efficiency;                        // (0, 1]
  std::optional<double> kernel_floor_us;                                              // >= 0
  std::optional<double> dispatch_us;                                                  // >= 0
  std::optional<bool> dispatch_overlaps;
  std::optional<double> view_dispatch_us;       // >= 0
  std::optional<double> overlap_efficiency;     // [0, 1]
  std::optional<double> wait_resume_us;         // >= 0
  std::optional<double> matmul_output_gbps;     // >= 0 (0: nothing)
  std::optional<double> matvec_gbps;            // >= 0 (0: priced as any product)
  std::optional<double> outer_product_gbps;     // >= 0 (0: priced as any product)
  std::optional<double> conv_weight_gbps;       // >= 0 (0: nothing)
  std::optional<double> conv_weight_grad_gbps;  // >= 0 (0: nothing)
  std::optional<bool> f32_uses_tf32;
};

/// Returns `spec` with the set fields of `overrides` applied. A peak or bandwidth that is zero,
/// negative or not finite, an efficiency outside (0, 1], or a negative floor is a kInvalidArgument
/// error naming the field and the value; the spec is then not modified.
Expected<DeviceSpec> applyOverrides(DeviceSpec spec, const DeviceOverrides& overrides);

/// Sets one peak by dtype name ("bf16", "f32", "tf32", "f64", "f16", "i8", or a torch alias such as
/// "bfloat16"); errors for an unknown name or a value that is not positive.
Status setPeakTflops(DeviceSpec& spec, std::string_view dtype_name, double tflops);

/// "h100: bf16 989 TFLOPS, f32 67 TFLOPS, HBM 3350 GB/s, eff 0.70/0.80, floor 2.0 us".
std::string toString(const DeviceSpec& spec);

}  // namespace apc::cost
