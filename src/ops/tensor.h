// Tensor: an activation buffer owned by a backend (host memory for the CPU backend).
//
// Activations are fp32 (or int32 for index tensors such as top-k selections) in this profile.
// The model never reads or writes a Tensor's elements itself; only ops do.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace sparrow {

enum class ElemType : uint8_t { kF32, kI32 };

class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<void> storage, void* data, ElemType type, std::vector<int64_t> shape)
      : storage_(std::move(storage)), data_(data), type_(type), shape_(std::move(shape)) {}

  bool empty() const { return data_ == nullptr; }
  ElemType type() const { return type_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_.at(i); }
  size_t rank() const { return shape_.size(); }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape_) n *= d;
    return n;
  }
  // Typed access, for backends only.
  float* f32() const { return static_cast<float*>(data_); }
  int32_t* i32() const { return static_cast<int32_t*>(data_); }
  // Same storage, another shape with the same element count (a view).
  Tensor reshaped(std::vector<int64_t> shape) const { return Tensor(storage_, data_, type_, std::move(shape)); }

 private:
  std::shared_ptr<void> storage_;
  void* data_ = nullptr;
  ElemType type_ = ElemType::kF32;
  std::vector<int64_t> shape_;
};

}  // namespace sparrow
