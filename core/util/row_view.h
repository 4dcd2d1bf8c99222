// Typed views of row-major float blocks, in place of pointer arithmetic.
//
//   RowView<T>    rows × cols, row r at data + r·stride (stride ≥ cols):
//                 a caller's (token, head, d) input as (tokens·heads) rows
//                 of d, or a slice of rows of a workspace
//   BlockView<T>  blocks × rows × cols, back to back: the (job, C, d)
//                 workspaces whose blocks are the batch elements of one
//                 batched matmul
//
// Views do not own their memory. Indices are checked in debug builds
// (assert); release builds compute exactly the pointer arithmetic they
// replace.
#ifndef LINATTN_CORE_UTIL_ROW_VIEW_H_
#define LINATTN_CORE_UTIL_ROW_VIEW_H_

#include <cassert>
#include <cstdint>

namespace linattn {

template <typename T>
class RowView {
 public:
  RowView() = default;
  RowView(T* data, uint64_t rows, uint64_t cols)
      : RowView(data, rows, cols, cols) {}
  RowView(T* data, uint64_t rows, uint64_t cols, uint64_t stride)
      : data_(data), rows_(rows), cols_(cols), stride_(stride) {
    assert(stride >= cols);
  }
  // A view of const elements reads the same rows.
  operator RowView<const T>() const {  // NOLINT: a widening conversion
    return RowView<const T>(data_, rows_, cols_, stride_);
  }

  T* data() const { return data_; }
  uint64_t rows() const { return rows_; }
  uint64_t cols() const { return cols_; }
  uint64_t stride() const { return stride_; }

  T* row(uint64_t r) const {
    assert(r < rows_);
    return data_ + r * stride_;
  }
  T& operator()(uint64_t r, uint64_t c) const {
    assert(c < cols_);
    return row(r)[c];
  }
  // Rows [first, first + n).
  RowView rows(uint64_t first, uint64_t n) const {
    assert(first + n <= rows_);
    return RowView(data_ + first * stride_, n, cols_, stride_);
  }

 private:
  T* data_ = nullptr;
  uint64_t rows_ = 0;
  uint64_t cols_ = 0;
  uint64_t stride_ = 0;
};

template <typename T>
class BlockView {
 public:
  BlockView() = default;
  BlockView(T* data, uint64_t blocks, uint64_t rows, uint64_t cols)
      : data_(data), blocks_(blocks), rows_(rows), cols_(cols) {}

  T* data() const { return data_; }
  uint64_t blocks() const { return blocks_; }
  uint64_t block_size() const { return rows_ * cols_; }

  RowView<T> block(uint64_t b) const {
    assert(b < blocks_);
    return RowView<T>(data_ + b * rows_ * cols_, rows_, cols_);
  }
  T* row(uint64_t b, uint64_t r) const { return block(b).row(r); }

 private:
  T* data_ = nullptr;
  uint64_t blocks_ = 0;
  uint64_t rows_ = 0;
  uint64_t cols_ = 0;
};

}  // namespace linattn

#endif  // LINATTN_CORE_UTIL_ROW_VIEW_H_
