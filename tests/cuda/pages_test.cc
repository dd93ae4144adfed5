// choreo's page gather and scatter kernels (kernels/cuda/kernels/pages.cuh) in the block emulator (issue 14),
// on pools whose extents are exactly their pages, so a word read or written past a piece is reported: every
// piece lands where the page list says, in 1-, 4- and 16-byte words, with grids smaller than the work in both
// directions (the grid-stride loops over words and over pages), and only the pieces' words of a pool change.
// The batched copies built on them are tested through kernels::Backend on every backend (tests/kernels).

#include "kernels/cuda/kernels/pages.cuh"

#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <vector>

namespace choreo::cuda {
namespace {

using cu::make_ptr;

/// n words of random bytes, seeded.
template <class Word>
std::vector<Word> random_words(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Word> out(n);
  for (Word& w : out) {
    unsigned char bytes[sizeof(Word)];
    for (unsigned char& b : bytes) b = static_cast<unsigned char>(rng() & 0xff);
    std::memcpy(&w, bytes, sizeof(Word));
  }
  return out;
}

template <class Word>
bool same(const Word& a, const Word& b) {
  return std::memcmp(&a, &b, sizeof(Word)) == 0;
}

template <class Word>
void gather_then_scatter(Dim3 grid, unsigned threads) {
  const kernels::PagePieces p{100, 5, 37, 7};  // 7 of 12 pages, words [5, 42) of each
  const std::vector<int32_t> pages = {11, 0, 4, 3, 10, 1, 6};
  const std::vector<Word> pool = random_words<Word>(12 * p.page_words, 1);
  std::vector<Word> buffer(size_t(p.n_pages) * p.range_words);
  cu::launch("gather_pages", kernels::gather_pages<Word>, grid, Dim3(threads), 0, nullptr,
             make_ptr(pool.data(), pool.size()), make_ptr(pages.data(), pages.size()), p,
             make_ptr(buffer.data(), buffer.size()));
  size_t wrong = 0;
  for (size_t i = 0; i < pages.size(); ++i)
    for (size_t w = 0; w < p.range_words; ++w)
      wrong +=
          !same(buffer[i * p.range_words + w], pool[size_t(pages[i]) * p.page_words + p.offset_words + w]);
  CHECK(wrong == 0);

  // Back into another pool: the pieces' words take the buffer's, every other word stays.
  const std::vector<Word> before = random_words<Word>(pool.size(), 2);
  std::vector<Word> after = before;
  cu::launch("scatter_pages", kernels::scatter_pages<Word>, grid, Dim3(threads), 0, nullptr,
             make_ptr<const Word>(buffer.data(), buffer.size()), make_ptr(pages.data(), pages.size()), p,
             make_ptr(after.data(), after.size()));
  std::vector<Word> want = before;
  for (size_t i = 0; i < pages.size(); ++i)
    for (size_t w = 0; w < p.range_words; ++w)
      want[size_t(pages[i]) * p.page_words + p.offset_words + w] =
          pool[size_t(pages[i]) * p.page_words + p.offset_words + w];
  wrong = 0;
  for (size_t i = 0; i < want.size(); ++i) wrong += !same(after[i], want[i]);
  CHECK(wrong == 0);
}

TEST_CASE(
    "cuda kernels (emulated): gather_pages and scatter_pages move each piece, in every word size and grid") {
  for (Dim3 grid : {Dim3(1, 1), Dim3(2, 3), Dim3(1, 7), Dim3(4, 9)}) {
    CAPTURE(grid.x);
    CAPTURE(grid.y);
    gather_then_scatter<uint8_t>(grid, 32);
    gather_then_scatter<uint32_t>(grid, 32);
    gather_then_scatter<kernels::Word16>(grid, 64);
  }
  // The geometry the backend launches: one row of blocks per page, blocks over a piece's words.
  const kernels::PagePieces p{768, 0, 768, 70};
  const Dim3 g = kernels::page_pieces_grid(p);
  CHECK(g.x == 3);
  CHECK(g.y == 70);
  CHECK(kernels::page_pieces_grid({1, 0, 1, 100000}).y == 65535);
}

TEST_CASE("cuda kernels: page copies take the widest word that divides the page stride, offset and length") {
  size_t word = 0;
  kernels::PagePieces got;
  const auto record = [&](auto w, const kernels::PagePieces& p) {
    word = sizeof(w);
    got = p;
  };
  kernels::in_page_words(12288, 4096, 1024, 3, record);
  CHECK(word == 16);
  CHECK(got.page_words == 768);
  CHECK(got.offset_words == 256);
  CHECK(got.range_words == 64);
  CHECK(got.n_pages == 3);
  kernels::in_page_words(592, 100, 400, 3, record);  // a 588-byte page's stride in the arena is 592
  CHECK(word == 4);
  CHECK(got.range_words == 100);
  kernels::in_page_words(592, 102, 192, 3, record);  // q8_0 and f16 rows: 2-byte boundaries
  CHECK(word == 1);
  CHECK(got.offset_words == 102);
}

}  // namespace
}  // namespace choreo::cuda
