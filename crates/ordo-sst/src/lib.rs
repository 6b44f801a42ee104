//! The shared state table (SST) of Derecho (spindle §II-B), over a fabric
//! [`Region`].
//!
//! Every member has a local copy of the whole table: one **row per member**.
//! A member writes only its own row and **pushes** a range of it to all or
//! some peers with one-sided writes; the other rows are read-only copies that
//! peers' pushes update. All columns are **monotonic** (counters only grow,
//! flags only go from false to true, lists only append or truncate a prefix),
//! so a late or repeated push just carries newer information: this is what
//! makes opportunistic batching and pushing after releasing a lock correct
//! (spindle §III-A, §III-C).
//!
//! # Layout
//! A table starts at a 64-byte aligned `base` offset in the region. Rows are
//! `row_stride` bytes (a multiple of 64, so two members' rows never share a
//! cache line); row `i` belongs to the `i`-th member of the sorted member
//! list. Columns are placed in declaration order, 8-byte aligned, at the same
//! offset in every row:
//!
//! ```text
//! region offset                 row bytes (example: received, delivered, slots[3], acks list cap 4)
//! base + 0*stride  +--------+---------+----------+----------+----------+------------------+---------+
//!  row 0 (member a)| recv 8 | deliv 8 | slots[0] | slots[1] | slots[2] | list hdr 16      | items 32 | pad..64k
//! base + 1*stride  +--------+---------+----------+----------+----------+------------------+---------+
//!  row 1 (member b)|  ...   same columns at the same offsets                                         |
//!                  +--------------------------------------------------------------------------------+
//! ```
//! [`SstLayout::diagram`] prints the actual offsets of a layout.
//!
//! # Column types and their encodings (all little-endian `u64` words)
//! - [`CounterCol`]: an `i64 ≥ -1` stored as `value + 1`, so zeroed memory
//!   reads as -1 (Derecho's initial value) and no row needs initialising —
//!   a peer's push can never be overwritten by a late initialisation.
//! - [`FlagCol`]: 0 = false, 1 = true.
//! - [`CounterArrayCol`]: `n` counters.
//! - [`ListCol`]: a guarded, bounded list of `u64`: header
//!   `{appended, truncated}` then `cap` item words; item `i` lives in word
//!   `i % cap` and is valid while `truncated ≤ i < appended`.
//!
//! # Invariants
//! - Only the owner writes its row, and only through this API, which asserts
//!   monotonicity (a bug otherwise: it panics).
//! - Reads are `Acquire` loads of whole words, so predicates can be evaluated
//!   while peers' writes land (the fabric never tears an aligned word).
//! - A list is pushed as *header, items, header* when its truncation changed
//!   and *items, header* otherwise, so (with the fabric's FIFO) a reader that
//!   re-checks `truncated` after reading items never accepts an overwritten
//!   item, and never sees `appended` before the items it covers.
//! - Nothing here does I/O: [`Sst::push`] only posts writes through a
//!   [`Fabric`] the caller owns; engines may instead take the ranges from
//!   [`Sst::range`] and emit them as effects.

#![warn(missing_docs)]

use ordo_fabric::{Fabric, MemberId, PostError, Region, Write};

/// A counter column (`i64 ≥ -1`, starts at -1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CounterCol {
    offset: usize,
}

/// A boolean column that only goes from false to true.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlagCol {
    offset: usize,
}

/// A fixed array of `len` counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CounterArrayCol {
    offset: usize,
    len: usize,
}

/// A guarded, bounded list of `u64` (append and prefix truncation only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListCol {
    offset: usize,
    cap: usize,
}

/// A byte range within a row (relative to the row start).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColumnRange {
    /// Offset from the start of the row.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
}

impl ColumnRange {
    /// The smallest range covering both.
    pub fn union(self, other: ColumnRange) -> ColumnRange {
        let start = self.offset.min(other.offset);
        let end = (self.offset + self.len).max(other.offset + other.len);
        ColumnRange { offset: start, len: end - start }
    }
}

impl From<CounterCol> for ColumnRange {
    fn from(c: CounterCol) -> Self {
        ColumnRange { offset: c.offset, len: 8 }
    }
}
impl From<FlagCol> for ColumnRange {
    fn from(c: FlagCol) -> Self {
        ColumnRange { offset: c.offset, len: 8 }
    }
}
impl From<CounterArrayCol> for ColumnRange {
    fn from(c: CounterArrayCol) -> Self {
        ColumnRange { offset: c.offset, len: 8 * c.len }
    }
}

impl CounterArrayCol {
    /// Number of counters.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the array has no counters.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The range of counters `i..j`.
    pub fn range(&self, i: usize, j: usize) -> ColumnRange {
        assert!(i <= j && j <= self.len, "counters {i}..{j} outside array of {}", self.len);
        ColumnRange { offset: self.offset + 8 * i, len: 8 * (j - i) }
    }
}

impl ListCol {
    /// Capacity in items.
    pub fn cap(&self) -> usize {
        self.cap
    }
    /// The header words `{appended, truncated}` (the guard).
    pub fn header(&self) -> ColumnRange {
        ColumnRange { offset: self.offset, len: 16 }
    }
    /// The item words.
    pub fn items(&self) -> ColumnRange {
        ColumnRange { offset: self.offset + 16, len: 8 * self.cap }
    }
}

#[derive(Clone, Debug)]
struct ColumnSpec {
    name: &'static str,
    kind: &'static str,
    offset: usize,
    len: usize,
}

/// Builds an [`SstLayout`] column by column.
#[derive(Debug, Default)]
pub struct LayoutBuilder {
    cursor: usize,
    columns: Vec<ColumnSpec>,
}

impl LayoutBuilder {
    /// An empty layout.
    pub fn new() -> Self {
        Self::default()
    }

    fn add(&mut self, name: &'static str, kind: &'static str, len: usize) -> usize {
        let offset = self.cursor;
        self.columns.push(ColumnSpec { name, kind, offset, len });
        self.cursor += len;
        debug_assert_eq!(self.cursor % 8, 0);
        offset
    }

    /// Adds a counter column.
    pub fn counter(&mut self, name: &'static str) -> CounterCol {
        CounterCol { offset: self.add(name, "counter", 8) }
    }

    /// Adds a flag column.
    pub fn flag(&mut self, name: &'static str) -> FlagCol {
        FlagCol { offset: self.add(name, "flag", 8) }
    }

    /// Adds an array of `len` counters.
    pub fn counters(&mut self, name: &'static str, len: usize) -> CounterArrayCol {
        CounterArrayCol { offset: self.add(name, "counter array", 8 * len), len }
    }

    /// Adds a guarded list of up to `cap` items (`cap ≥ 1`).
    pub fn list(&mut self, name: &'static str, cap: usize) -> ListCol {
        assert!(cap >= 1, "a list needs capacity");
        ListCol { offset: self.add(name, "list", 16 + 8 * cap), cap }
    }

    /// Starts the next column on a new cache line (to keep columns that are
    /// pushed separately apart, or to align a hot column).
    pub fn align_to_cache_line(&mut self) {
        self.cursor = self.cursor.next_multiple_of(64);
    }

    /// Finishes the layout; the row stride is rounded up to 64 bytes.
    pub fn build(self) -> SstLayout {
        SstLayout { row_stride: self.cursor.max(8).next_multiple_of(64), columns: self.columns }
    }
}

/// The column layout of one row; identical on every member.
#[derive(Clone, Debug)]
pub struct SstLayout {
    row_stride: usize,
    columns: Vec<ColumnSpec>,
}

impl SstLayout {
    /// Bytes per row (a multiple of 64).
    pub fn row_stride(&self) -> usize {
        self.row_stride
    }

    /// Bytes a table of `rows` rows occupies.
    pub fn table_len(&self, rows: usize) -> usize {
        self.row_stride * rows
    }

    /// A text offset diagram of one row (name, kind, offset, length).
    pub fn diagram(&self) -> String {
        let mut s = format!("row stride {} bytes\n", self.row_stride);
        for c in &self.columns {
            s.push_str(&format!(
                "  [{:>6} .. {:>6})  {:<14} {}\n",
                c.offset,
                c.offset + c.len,
                c.kind,
                c.name
            ));
        }
        s
    }
}

/// Errors constructing an [`Sst`] (configuration mistakes).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SstError {
    /// The table does not fit in the region at `base`.
    #[error("SST of {needed} bytes at offset {base} does not fit in a region of {region_len} bytes")]
    DoesNotFit {
        /// Requested start of the table, in bytes from the region's start.
        base: usize,
        /// Size of the table, in bytes.
        needed: usize,
        /// Length of the region, in bytes.
        region_len: usize,
    },
    /// `base` is not cache-line aligned.
    #[error("SST base offset {0} is not 64-byte aligned")]
    Misaligned(usize),
    /// The local member is not in the member list, or the list has duplicates.
    #[error("bad member list: {0}")]
    BadMembers(String),
    /// A peer's list header is impossible (a lying or corrupt peer).
    #[error("row {row}: list header appended {appended}, truncated {truncated} does not fit capacity {cap}")]
    BadList {
        /// The row read.
        row: usize,
        /// Items appended, as read.
        appended: u64,
        /// Items truncated, as read.
        truncated: u64,
        /// The list's capacity.
        cap: usize,
    },
}

/// A list append that does not fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("list full: {live} live items of capacity {cap}, appending {adding}")]
pub struct ListFull {
    /// Items not yet truncated.
    pub live: usize,
    /// Capacity.
    pub cap: usize,
    /// Items the append wanted to add.
    pub adding: usize,
}

/// A member's view of a shared state table. See the crate docs.
#[derive(Clone, Debug)]
pub struct Sst {
    region: Region,
    base: usize,
    layout: SstLayout,
    members: Vec<MemberId>,
    my_row: usize,
}

impl Sst {
    /// A table at `base` in `region` with one row per member of `members`
    /// (sorted), for local member `me`.
    pub fn new(
        region: Region,
        base: usize,
        layout: SstLayout,
        members: &[MemberId],
        me: MemberId,
    ) -> Result<Sst, SstError> {
        if !base.is_multiple_of(64) {
            return Err(SstError::Misaligned(base));
        }
        let mut sorted = members.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != members.len() {
            return Err(SstError::BadMembers(format!("duplicates in {members:?}")));
        }
        let my_row = sorted
            .binary_search(&me)
            .map_err(|_| SstError::BadMembers(format!("member {me} not in {members:?}")))?;
        let needed = layout.table_len(sorted.len());
        if base.checked_add(needed).is_none_or(|end| end > region.len()) {
            return Err(SstError::DoesNotFit { base, needed, region_len: region.len() });
        }
        Ok(Sst { region, base, layout, members: sorted, my_row })
    }

    /// The members, sorted; row `i` is `members()[i]`'s.
    pub fn members(&self) -> &[MemberId] {
        &self.members
    }

    /// The local member's row index.
    pub fn my_row(&self) -> usize {
        self.my_row
    }

    /// The row index of `member`, if it is in the table.
    pub fn row_of(&self, member: MemberId) -> Option<usize> {
        self.members.binary_search(&member).ok()
    }

    /// The layout.
    pub fn layout(&self) -> &SstLayout {
        &self.layout
    }

    /// The region the table lives in.
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// First byte after the table in the region.
    pub fn end_offset(&self) -> usize {
        self.base + self.layout.table_len(self.members.len())
    }

    #[inline]
    fn word(&self, row: usize, offset: usize) -> usize {
        assert!(row < self.members.len(), "row {row} out of {}", self.members.len());
        self.base + row * self.layout.row_stride + offset
    }

    // ---- reads (any row) ----

    /// Counter `col` of `row` (Acquire).
    #[inline]
    pub fn counter(&self, row: usize, col: CounterCol) -> i64 {
        (self.region.load_acquire(self.word(row, col.offset)) as i64).wrapping_sub(1)
    }

    /// Flag `col` of `row` (Acquire).
    #[inline]
    pub fn flag(&self, row: usize, col: FlagCol) -> bool {
        self.region.load_acquire(self.word(row, col.offset)) != 0
    }

    /// Counter `i` of array `col` in `row` (Acquire).
    #[inline]
    pub fn counter_at(&self, row: usize, col: CounterArrayCol, i: usize) -> i64 {
        assert!(i < col.len, "counter {i} outside array of {}", col.len);
        (self.region.load_acquire(self.word(row, col.offset + 8 * i)) as i64).wrapping_sub(1)
    }

    /// The minimum of counter `col` over `rows` (e.g. the stability
    /// predicate "every member has received s"). `None` if `rows` is empty.
    pub fn min_counter(&self, col: CounterCol, rows: impl IntoIterator<Item = usize>) -> Option<i64> {
        rows.into_iter().map(|r| self.counter(r, col)).min()
    }

    /// Reads the live items of list `col` in `row` into `out` (cleared
    /// first) and returns the index of the first one. Items that the owner
    /// truncated (and may be overwriting) while they were read are dropped,
    /// so every returned item is one the owner appended at that index. A
    /// header no honest owner writes (more live items than the capacity, or
    /// a truncation that went back) is an [`SstError::BadList`] and `out`
    /// stays empty.
    pub fn list(&self, row: usize, col: ListCol, out: &mut Vec<u64>) -> Result<u64, SstError> {
        out.clear();
        let h = self.word(row, col.offset);
        let appended = self.region.load_acquire(h);
        let truncated = self.region.load_acquire(h + 8).min(appended);
        if appended - truncated > col.cap as u64 {
            return Err(SstError::BadList { row, appended, truncated, cap: col.cap });
        }
        for i in truncated..appended {
            let w = self.word(row, col.offset + 16 + 8 * (i as usize % col.cap));
            out.push(self.region.load_acquire(w));
        }
        let truncated_after = self.region.load_acquire(h + 8).min(appended);
        if truncated_after < truncated {
            out.clear();
            return Err(SstError::BadList { row, appended, truncated: truncated_after, cap: col.cap });
        }
        let drop = (truncated_after - truncated) as usize;
        out.drain(..drop.min(out.len()));
        Ok(truncated_after)
    }

    // ---- writes (own row only) ----

    /// Sets the local counter `col` to `value` (must not decrease).
    #[inline]
    pub fn set_counter(&self, col: CounterCol, value: i64) {
        let w = self.word(self.my_row, col.offset);
        self.store_counter(w, value);
    }

    /// Sets the local counter `i` of array `col` (must not decrease).
    #[inline]
    pub fn set_counter_at(&self, col: CounterArrayCol, i: usize, value: i64) {
        assert!(i < col.len, "counter {i} outside array of {}", col.len);
        let w = self.word(self.my_row, col.offset + 8 * i);
        self.store_counter(w, value);
    }

    #[inline]
    fn store_counter(&self, word: usize, value: i64) {
        assert!(value >= -1, "SST counters are ≥ -1, got {value}");
        let old = self.region.load_relaxed(word) as i64 - 1;
        assert!(value >= old, "SST counters are monotonic: {old} -> {value}");
        self.region.store_release(word, (value + 1) as u64);
    }

    /// Sets the local flag `col` (it never goes back to false).
    pub fn set_flag(&self, col: FlagCol) {
        self.region.store_release(self.word(self.my_row, col.offset), 1);
    }

    /// Appends `items` to the local list `col`.
    pub fn list_append(&self, col: ListCol, items: &[u64]) -> Result<(), ListFull> {
        let h = self.word(self.my_row, col.offset);
        let appended = self.region.load_relaxed(h);
        let truncated = self.region.load_relaxed(h + 8);
        let live = (appended - truncated) as usize;
        if live + items.len() > col.cap {
            return Err(ListFull { live, cap: col.cap, adding: items.len() });
        }
        for (k, item) in items.iter().enumerate() {
            let i = appended as usize + k;
            self.region.store_release(self.word(self.my_row, col.offset + 16 + 8 * (i % col.cap)), *item);
        }
        self.region.store_release(h, appended + items.len() as u64);
        Ok(())
    }

    /// Truncates the local list `col` so that items before index `upto` are
    /// dropped (monotonic; capped at the number appended).
    pub fn list_truncate(&self, col: ListCol, upto: u64) {
        let h = self.word(self.my_row, col.offset);
        let appended = self.region.load_relaxed(h);
        let old = self.region.load_relaxed(h + 8);
        assert!(upto >= old, "list truncation is monotonic: {old} -> {upto}");
        self.region.store_release(h + 8, upto.min(appended));
    }

    // ---- pushes ----

    /// The absolute region range of `range` in the local row.
    pub fn range(&self, range: impl Into<ColumnRange>) -> (usize, usize) {
        let r = range.into();
        assert!(r.offset + r.len <= self.layout.row_stride, "range outside the row");
        (self.word(self.my_row, r.offset), r.len)
    }

    /// Pushes `range` of the local row to `peers` (all members but the local
    /// one when `peers` is `None`). Suspected peers are skipped; other post
    /// errors are returned.
    pub fn push<F: Fabric>(
        &self,
        fabric: &mut F,
        range: impl Into<ColumnRange>,
        peers: Option<&[MemberId]>,
    ) -> Result<usize, PostError> {
        let (offset, len) = self.range(range);
        let mut posted = 0;
        let me = self.members[self.my_row];
        let targets = peers.unwrap_or(&self.members);
        for &peer in targets.iter().filter(|p| **p != me) {
            match fabric.post_write(Write::new(peer, offset, len)) {
                Ok(()) => posted += 1,
                Err(PostError::PeerSuspected(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(posted)
    }

    /// Pushes list `col` in the order the crate docs require: the
    /// `truncated` word, then the items, then the header. The first write
    /// makes a truncation visible before any item it frees is overwritten,
    /// whichever peers got earlier pushes. Returns the writes posted.
    pub fn push_list<F: Fabric>(
        &mut self,
        fabric: &mut F,
        col: ListCol,
        peers: Option<&[MemberId]>,
    ) -> Result<usize, PostError> {
        let truncated = ColumnRange { offset: col.offset + 8, len: 8 };
        let mut posted = self.push(fabric, truncated, peers)?;
        posted += self.push(fabric, col.items(), peers)?;
        posted += self.push(fabric, col.header(), peers)?;
        Ok(posted)
    }
}

#[cfg(test)]
mod tests;
