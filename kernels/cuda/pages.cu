// The device build of page gather and scatter (kernels/cuda/kernels/pages.cuh), with host entry points that
// launch them on a stream. The same kernel source runs in the block emulator (tests/cuda/pages_test.cc) and
// in the CUDA backend's batched tier copies (kernels/cuda/pages_backend.cuh).

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/kernels/pages.cuh"

namespace choreo::cuda {

namespace {

/// Launches pick(Word{}) (gather_pages or scatter_pages, which take the same arguments) from src to dst, in
/// the widest word the page stride and the range allow.
template <class Pick>
void launch_pieces(const char* name, Pick pick, const void* src, const int32_t* pages, void* dst, size_t page_bytes,
                   size_t offset, size_t bytes, int n_pages, cudaStream_t stream) {
  if (n_pages <= 0 || bytes == 0) return;
  kernels::in_page_words(page_bytes, offset, bytes, n_pages, [&](auto word, const kernels::PagePieces& p) {
    using Word = decltype(word);
    cu::launch(name, pick(word), kernels::page_pieces_grid(p), dim3(kernels::kPagePiecesThreads), 0, stream,
               static_cast<const Word*>(src), pages, p, static_cast<Word*>(dst));
  });
}

}  // namespace

void launch_gather_pages(const void* pool, size_t page_bytes, const int32_t* pages, int n_pages, size_t offset,
                         size_t bytes, void* buffer, cudaStream_t stream) {
  const auto pick = [](auto word) { return &kernels::gather_pages<decltype(word)>; };
  launch_pieces("gather_pages", pick, pool, pages, buffer, page_bytes, offset, bytes, n_pages, stream);
}

void launch_scatter_pages(const void* buffer, void* pool, size_t page_bytes, const int32_t* pages, int n_pages,
                          size_t offset, size_t bytes, cudaStream_t stream) {
  const auto pick = [](auto word) { return &kernels::scatter_pages<decltype(word)>; };
  launch_pieces("scatter_pages", pick, buffer, pages, pool, page_bytes, offset, bytes, n_pages, stream);
}

}  // namespace choreo::cuda
