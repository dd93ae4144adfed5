#pragma once
// Page gather and scatter (issue 14): the pieces of a tier copy, one byte range of each page of a list, moved
// between a KV page arena and one contiguous device buffer, so that a message goes to or from host memory as
// one transfer instead of one per page (CoreBackend::copy_pages_to_host / copy_pages_from_host). Written once
// against kernels/cuda/portable.h: nvcc builds them (kernels/cuda/pages.cu), the block emulator runs them.
//
// The pool and the buffer are seen as arrays of a word type chosen by the caller (1, 4 or 16 bytes: the
// widest that divides the range's offset and length and the arena's page stride), so an f32 page moves in
// 16-byte words and a range of f16 or q8_0 rows that is only 2-byte aligned still moves correctly, byte by
// byte. Blocks cover (words of a piece) x (pieces), both grid-strided; every word is read and written once by
// one thread, so no shared memory and no synchronisation are needed.

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/kernels/device.cuh"
#include "kernels/cuda/portable.h"

namespace choreo::cuda::kernels {

/// 16 bytes moved as one (a vector load and store on the device).
struct alignas(16) Word16 {
  uint32_t v[4];
};

/// Where the pieces are: page pages[i] of the pool (pages page_words words apart) holds piece i at words
/// [offset_words, offset_words + range_words); the buffer holds piece i at words [i * range_words, ...).
struct PagePieces {
  size_t page_words = 0, offset_words = 0, range_words = 0;
  int n_pages = 0;
};

/// buffer <- the pieces of the pool's pages.
template <class Word>
CHOREO_GLOBAL void gather_pages(cu::Ptr<const Word> pool, cu::Ptr<const int32_t> pages, PagePieces p,
                                cu::Ptr<Word> buffer) {
  for (size_t i = cu::block_idx().y; i < size_t(p.n_pages); i += cu::grid_dim().y) {
    const size_t from = size_t(pages[i]) * p.page_words + p.offset_words, to = i * p.range_words;
    for (size_t w = global_index(); w < p.range_words; w += grid_stride()) buffer[to + w] = pool[from + w];
  }
}

/// The pieces of the pool's pages <- buffer. The pages must be distinct (else two threads write one word).
template <class Word>
CHOREO_GLOBAL void scatter_pages(cu::Ptr<const Word> buffer, cu::Ptr<const int32_t> pages, PagePieces p,
                                 cu::Ptr<Word> pool) {
  for (size_t i = cu::block_idx().y; i < size_t(p.n_pages); i += cu::grid_dim().y) {
    const size_t from = i * p.range_words, to = size_t(pages[i]) * p.page_words + p.offset_words;
    for (size_t w = global_index(); w < p.range_words; w += grid_stride()) pool[to + w] = buffer[from + w];
  }
}

/// Launch geometry of both: blocks of 256 threads over a piece's words (grid_stride_blocks), one row of
/// blocks per page up to 65,535 (more pages are strided over).
inline Dim3 page_pieces_grid(const PagePieces& p) {
  return Dim3(grid_stride_blocks(p.range_words), unsigned(p.n_pages < 65535 ? p.n_pages : 65535));
}
inline constexpr unsigned kPagePiecesThreads = 256;

/// Calls launch(Word{}, pieces) with the widest word (16, 4 or 1 bytes) that divides the pool's page stride,
/// the range's offset and its length, and the pieces of n_pages pages counted in that word.
template <class Launch>
void in_page_words(size_t page_bytes, size_t offset, size_t bytes, int n_pages, Launch launch) {
  const size_t all = page_bytes | offset | bytes;
  const auto pieces = [&](size_t word) {
    return PagePieces{page_bytes / word, offset / word, bytes / word, n_pages};
  };
  if (all % 16 == 0)
    launch(Word16{}, pieces(16));
  else if (all % 4 == 0)
    launch(uint32_t{}, pieces(4));
  else
    launch(uint8_t{}, pieces(1));
}

}  // namespace choreo::cuda::kernels
