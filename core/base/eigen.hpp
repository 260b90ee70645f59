#pragma once
// The one header that includes Eigen. Everything in vitlens is row-major, like PyTorch tensors,
// so a (rows, cols) buffer maps onto an Eigen matrix without copying.
//
// Dimension legend used in shape comments across the code base:
//   N = tokens (class token first when the model has one, then patches in row-major order)
//   D = embed dim, H = heads, d = D / H (head dim), P = patch side, L = layers (depth)
//   gh, gw = patch grid rows and columns, Hm = MLP hidden size
#include <Eigen/Core>

namespace vitlens {

using MatRM = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using VecF = Eigen::Matrix<float, Eigen::Dynamic, 1>;
using RowVecF = Eigen::Matrix<float, 1, Eigen::Dynamic>;
using MapRM = Eigen::Map<MatRM>;
using ConstMapRM = Eigen::Map<const MatRM>;
using MapVec = Eigen::Map<VecF>;
using ConstMapVec = Eigen::Map<const VecF>;
// A row-major matrix whose rows are a fixed stride apart (e.g. one head's columns of qkv).
using StridedMapRM = Eigen::Map<const MatRM, 0, Eigen::OuterStride<>>;

}  // namespace vitlens
