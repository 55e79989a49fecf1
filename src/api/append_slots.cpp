#include "api/append_slots.h"

#include <algorithm>
#include <sstream>
#include <vector>

namespace tileattn {
namespace {

// A slot numbered across the whole cache: entry * Smax + position (contiguous) or
// page * page_size + row (paged).
struct SlotWrite {
  int64_t slot;
  int sequence;
  int64_t position;  // in the sequence's cache positions
};

class CacheSlots {
 public:
  explicit CacheSlots(const KvCacheParams& p)
      : p_(p), paged_(p.block_table != nullptr), unit_(paged_ ? p.page_size : p.fwd.seqlen_k) {}

  int row(int b) const { return p_.cache_batch_idx ? p_.cache_batch_idx[b] : b; }

  int64_t slot(int b, int64_t t) const {
    if (!paged_) return int64_t{row(b)} * unit_ + t;
    return int64_t{p_.block_table[row(b) * p_.block_table_batch_stride + t / unit_]} * unit_ + t % unit_;
  }

  std::string describe(int64_t slot) const {
    std::ostringstream s;
    s << (paged_ ? "page " : "cache entry ") << slot / unit_ << (paged_ ? ", row " : ", position ")
      << slot % unit_;
    return s.str();
  }

  // Calls visit(first_slot, first_position, count) for the runs of consecutive slots that hold
  // positions [begin, end) of sequence b: one run a page when paged.
  template <typename Visit>
  void for_each_run(int b, int64_t begin, int64_t end, Visit visit) const {
    while (begin < end) {
      const int64_t run_end = paged_ ? std::min(end, (begin / unit_ + 1) * unit_) : end;
      visit(slot(b, begin), begin, run_end - begin);
      begin = run_end;
    }
  }

 private:
  const KvCacheParams& p_;
  bool paged_;
  int64_t unit_;
};

}  // namespace

void check_append_slots(const KvCacheParams& p) {
  if (p.k_new == nullptr) return;
  const CacheSlots slots(p);
  const int batch = p.fwd.batch;
  std::vector<SlotWrite> writes;
  writes.reserve(static_cast<size_t>(batch) * p.seqlen_new);
  for (int b = 0; b < batch; ++b) {
    for (int64_t t = p.cache_seqlens[b]; t < int64_t{p.cache_seqlens[b]} + p.seqlen_new; ++t) {
      writes.push_back({slots.slot(b, t), b, t});
    }
  }
  std::sort(writes.begin(), writes.end(),
            [](const SlotWrite& x, const SlotWrite& y) { return x.slot < y.slot; });

  // Every slot a sequence uses (its visible positions, the appended ones included) may be written
  // only by that sequence at that position.
  for (int reader = 0; reader < batch; ++reader) {
    const int64_t begin = p.cache_leftpad ? p.cache_leftpad[reader] : 0;
    const int64_t end = int64_t{p.cache_seqlens[reader]} + p.seqlen_new;
    slots.for_each_run(reader, begin, end, [&](int64_t first, int64_t position, int64_t count) {
      auto w = std::lower_bound(writes.begin(), writes.end(), first,
                                [](const SlotWrite& x, int64_t s) { return x.slot < s; });
      for (; w != writes.end() && w->slot < first + count; ++w) {
        const int64_t read_at = position + (w->slot - first);
        if (w->sequence == reader && w->position == read_at) continue;
        // Two sequences on one cache entry (or block-table row) can only come from cache_batch_idx.
        const bool shared_entry = w->sequence != reader && slots.row(w->sequence) == slots.row(reader);
        std::ostringstream message;
        message << "sequence " << w->sequence << " appends its position " << w->position << " into "
                << slots.describe(w->slot) << ", which sequence " << reader << " uses as its position "
                << read_at << ": the append would race with that read";
        if (shared_entry) message << " (both sequences use cache_batch_idx " << slots.row(reader) << ")";
        throw Error(ErrorCode::kInvalidArgument, shared_entry ? "cache_batch_idx" : "block_table", message.str());
      }
    });
  }
}

}  // namespace tileattn
