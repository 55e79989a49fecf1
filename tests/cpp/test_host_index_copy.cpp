// HostIndexCopy (TILEATTN_CHECK_CONTENTS=on): which arrays it copies, how many entries of each, and
// that the params it hands on point at the copies, with memcpy standing in for the device copy.
#include <gtest/gtest.h>

#include <cstring>
#include <utility>
#include <vector>

#include "api/host_index_copy.h"

namespace tileattn::test {
namespace {

// Every copy asked for, as (source, bytes); a static because CopyToHost is a plain function.
std::vector<std::pair<const void*, size_t>> copies;

void recorded_copy(void* destination, const void* source, size_t bytes, void*) {
  copies.emplace_back(source, bytes);
  std::memcpy(destination, source, bytes);
}

TEST(HostIndexCopy, CopiesTheSequenceArraysOfAVarlenCall) {
  std::vector<int32_t> cu_q = {0, 2, 5, 6}, cu_k = {0, 7, 14, 20}, used = {3, 7, 1};
  ForwardParams p = default_forward_params();
  p.batch = 3, p.cu_seqlens_q = cu_q.data(), p.cu_seqlens_k = cu_k.data(), p.seqused_k = used.data();
  copies.clear();
  const HostIndexCopy host(p, recorded_copy);
  const ForwardParams& h = host.forward_params();
  ASSERT_EQ(copies.size(), 3u);
  EXPECT_EQ(copies[0], std::make_pair(static_cast<const void*>(cu_q.data()), size_t{16}));
  EXPECT_EQ(copies[1], std::make_pair(static_cast<const void*>(cu_k.data()), size_t{16}));
  EXPECT_EQ(copies[2], std::make_pair(static_cast<const void*>(used.data()), size_t{12}));
  EXPECT_NE(h.cu_seqlens_q, cu_q.data());  // the copies, not the originals
  EXPECT_EQ(std::vector<int32_t>(h.cu_seqlens_q, h.cu_seqlens_q + 4), cu_q);
  EXPECT_EQ(std::vector<int32_t>(h.cu_seqlens_k, h.cu_seqlens_k + 4), cu_k);
  EXPECT_EQ(std::vector<int32_t>(h.seqused_k, h.seqused_k + 3), used);
  EXPECT_EQ(h.batch, 3);
}

TEST(HostIndexCopy, CopiesNothingForTheBatchForm) {
  ForwardParams p = default_forward_params();
  p.batch = 2;
  copies.clear();
  const HostIndexCopy host(p, recorded_copy);
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(host.forward_params().cu_seqlens_q, nullptr);
  EXPECT_EQ(host.forward_params().seqused_k, nullptr);
}

// Two sequences over three block-table rows of stride 6 and 4 columns: the copy runs from the
// first entry to the last column of the last row, 2 * 6 + 4 entries, and keeps the stride.
TEST(HostIndexCopy, CopiesTheKvCacheArraysAndTheBlockTableRows) {
  std::vector<int32_t> seqlens = {3, 40}, batch_idx = {2, 0}, leftpad = {1, 0}, cu_q = {0, 1, 3};
  std::vector<int32_t> table(3 * 6);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
  KvCacheParams p = default_kvcache_params();
  p.fwd.batch = 2, p.fwd.cu_seqlens_q = cu_q.data();
  p.cache_seqlens = seqlens.data(), p.cache_batch_idx = batch_idx.data(), p.cache_leftpad = leftpad.data();
  p.block_table = table.data(), p.block_table_batch_stride = 6, p.num_cache_entries = 3, p.max_blocks = 4;
  copies.clear();
  const HostIndexCopy host(p, recorded_copy);
  const KvCacheParams& h = host.kvcache_params();
  ASSERT_EQ(copies.size(), 5u);
  EXPECT_EQ(copies[0].second, 12u);  // cu_seqlens_q
  EXPECT_EQ(copies[4], std::make_pair(static_cast<const void*>(table.data()), size_t{(2 * 6 + 4) * 4}));
  EXPECT_EQ(std::vector<int32_t>(h.cache_seqlens, h.cache_seqlens + 2), seqlens);
  EXPECT_EQ(std::vector<int32_t>(h.cache_batch_idx, h.cache_batch_idx + 2), batch_idx);
  EXPECT_EQ(std::vector<int32_t>(h.cache_leftpad, h.cache_leftpad + 2), leftpad);
  EXPECT_EQ(h.block_table[2 * 6 + 3], 15);
  EXPECT_EQ(h.block_table_batch_stride, 6);
  EXPECT_EQ(h.fwd.cu_seqlens_k, nullptr);
}

TEST(HostIndexCopy, ContiguousCacheCopiesNoBlockTable) {
  std::vector<int32_t> seqlens = {3, 40};
  KvCacheParams p = default_kvcache_params();
  p.fwd.batch = 2, p.cache_seqlens = seqlens.data(), p.num_cache_entries = 2;
  copies.clear();
  const HostIndexCopy host(p, recorded_copy);
  EXPECT_EQ(copies.size(), 1u);
  EXPECT_EQ(host.kvcache_params().block_table, nullptr);
}

}  // namespace
}  // namespace tileattn::test
