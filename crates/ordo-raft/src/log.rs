//! The node's in-memory view of its log: the latest snapshot plus the
//! entries after it, and how far the caller has been handed / has made
//! durable.
//!
//! Invariants (checked by `check` in debug and test builds):
//! - `entries[k].index == snapshot.meta.index + 1 + k` (contiguous) and
//!   terms are non-decreasing, at least `snapshot.meta.term`.
//! - `persisted <= stable <= last_index()`: entries up to `stable` were
//!   handed out in a `Ready`; entries up to `persisted` were reported
//!   durable by the caller (`Node::advance`).

use crate::types::{Entry, Index, Snapshot, Term};

#[derive(Clone, Debug)]
pub(crate) struct RaftLog {
    /// The latest snapshot (index 0: none). Its data is what the leader
    /// sends in InstallSnapshot.
    pub(crate) snapshot: Snapshot,
    entries: Vec<Entry>,
    /// Highest index handed to the caller in a `Ready`.
    pub(crate) stable: Index,
    /// Highest index the caller reported durable.
    pub(crate) persisted: Index,
    /// A snapshot installed from the leader that the next `Ready` must hand
    /// out.
    pub(crate) pending_snapshot: bool,
}

impl RaftLog {
    /// A log recovered from disk: everything is already stable and durable.
    pub(crate) fn recovered(snapshot: Snapshot, entries: Vec<Entry>) -> RaftLog {
        let mut log = RaftLog { snapshot, entries, stable: 0, persisted: 0, pending_snapshot: false };
        log.stable = log.last_index();
        log.persisted = log.last_index();
        log
    }

    pub(crate) fn snapshot_index(&self) -> Index {
        self.snapshot.meta.index
    }

    pub(crate) fn first_index(&self) -> Index {
        self.snapshot.meta.index + 1
    }

    pub(crate) fn last_index(&self) -> Index {
        self.snapshot.meta.index + self.entries.len() as u64
    }

    pub(crate) fn last_term(&self) -> Term {
        self.entries.last().map_or(self.snapshot.meta.term, |e| e.term)
    }

    /// The term of the entry at `index`, if known (the snapshot's last
    /// entry counts; compacted and future indexes do not).
    pub(crate) fn term(&self, index: Index) -> Option<Term> {
        if index == self.snapshot.meta.index {
            return Some(self.snapshot.meta.term);
        }
        self.entry(index).map(|e| e.term)
    }

    pub(crate) fn entry(&self, index: Index) -> Option<&Entry> {
        if index <= self.snapshot.meta.index {
            return None;
        }
        let offset = index - self.snapshot.meta.index - 1;
        usize::try_from(offset).ok().and_then(|k| self.entries.get(k))
    }

    /// Entries from `lo` through `hi` (inclusive), at most `max_entries` and
    /// about `max_bytes` of data (at least one entry if any is in range).
    /// Indexes outside the in-memory log are clamped away.
    pub(crate) fn slice(&self, lo: Index, hi: Index, max_entries: usize, max_bytes: u64) -> Vec<Entry> {
        let lo = lo.max(self.first_index());
        let hi = hi.min(self.last_index());
        if lo > hi || max_entries == 0 {
            return Vec::new();
        }
        // The range in `entries` (contiguous from the snapshot's index), cut
        // to `max_entries`: one allocation of the right size, no per-entry
        // index lookups.
        let first = (lo - self.first_index()) as usize;
        let count = ((hi - lo + 1) as usize).min(max_entries);
        let range = &self.entries[first..first + count];
        let mut taken = range.len();
        if max_bytes != u64::MAX {
            let mut bytes = 0u64;
            for (k, entry) in range.iter().enumerate() {
                bytes = bytes.saturating_add(entry.data.len() as u64);
                if k > 0 && bytes > max_bytes {
                    taken = k;
                    break;
                }
            }
        }
        range[..taken].to_vec()
    }

    /// Appends `entry`, which must be the next index.
    pub(crate) fn push(&mut self, entry: Entry) {
        assert_eq!(entry.index, self.last_index() + 1, "log append out of order");
        assert!(entry.term >= self.last_term(), "log term regression");
        self.entries.push(entry);
    }

    /// Removes every entry at or after `index` (> snapshot index).
    pub(crate) fn truncate_from(&mut self, index: Index) {
        assert!(index > self.snapshot.meta.index, "truncating into the snapshot");
        if index > self.last_index() {
            return;
        }
        let keep = (index - self.snapshot.meta.index - 1) as usize;
        self.entries.truncate(keep);
        self.stable = self.stable.min(index - 1);
        self.persisted = self.persisted.min(index - 1);
    }

    /// The entries not yet handed out; marks them handed out.
    pub(crate) fn take_unstable(&mut self) -> Vec<Entry> {
        let from = self.stable.max(self.snapshot.meta.index) + 1;
        let out = self.slice(from, self.last_index(), usize::MAX, u64::MAX);
        self.stable = self.last_index();
        out
    }

    /// What `take_unstable` does, without the copies (a caller that keeps
    /// no log of its own).
    pub(crate) fn mark_stable(&mut self) {
        self.stable = self.last_index();
    }

    pub(crate) fn has_unstable(&self) -> bool {
        self.stable < self.last_index()
    }

    /// Raft §5.4.1: is (`index`, `term`) at least as up to date as our log?
    pub(crate) fn is_up_to_date(&self, index: Index, term: Term) -> bool {
        term > self.last_term() || (term == self.last_term() && index >= self.last_index())
    }

    /// The largest index `<= index` whose term is `<= term` (or the first
    /// index we cannot look up, if we reach the compacted prefix).
    pub(crate) fn find_conflict_by_term(&self, index: Index, term: Term) -> Index {
        let mut i = index.min(self.last_index());
        loop {
            match self.term(i) {
                Some(t) if t > term => i -= 1,
                _ => return i,
            }
        }
    }

    /// Replaces the whole log by `snapshot` (InstallSnapshot).
    pub(crate) fn restore(&mut self, snapshot: Snapshot) {
        self.entries.clear();
        self.stable = snapshot.meta.index;
        self.persisted = 0;
        self.snapshot = snapshot;
        self.pending_snapshot = true;
    }

    /// Drops every entry up to `snapshot.meta.index`, which is in the log.
    pub(crate) fn compact(&mut self, snapshot: Snapshot) {
        let index = snapshot.meta.index;
        assert!(index > self.snapshot.meta.index && index <= self.last_index());
        let drop = (index - self.snapshot.meta.index) as usize;
        self.entries.drain(..drop);
        self.snapshot = snapshot;
        self.stable = self.stable.max(index);
        self.persisted = self.persisted.max(index);
    }

    /// Entries after the snapshot (for membership scans).
    pub(crate) fn entries(&self) -> &[Entry] {
        &self.entries
    }

    #[cfg(any(test, debug_assertions))]
    pub(crate) fn check(&self) {
        let mut term = self.snapshot.meta.term;
        for (k, e) in self.entries.iter().enumerate() {
            assert_eq!(e.index, self.snapshot.meta.index + 1 + k as u64);
            assert!(e.term >= term);
            term = e.term;
        }
        assert!(self.persisted <= self.stable);
        assert!(self.stable <= self.last_index());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{EntryKind, SnapshotMeta};

    fn log_with_terms(snapshot: (Index, Term), terms: &[Term]) -> RaftLog {
        let meta = SnapshotMeta { index: snapshot.0, term: snapshot.1, membership: Default::default() };
        let entries = terms
            .iter()
            .enumerate()
            .map(|(k, &term)| Entry {
                term,
                index: snapshot.0 + 1 + k as u64,
                kind: EntryKind::Normal,
                data: vec![0; 10].into(),
            })
            .collect();
        RaftLog::recovered(Snapshot { meta, data: Vec::new() }, entries)
    }

    #[test]
    fn terms_and_bounds() {
        let log = log_with_terms((5, 2), &[2, 3, 3, 4]);
        assert_eq!((log.first_index(), log.last_index(), log.last_term()), (6, 9, 4));
        assert_eq!(log.term(4), None, "compacted");
        assert_eq!(log.term(5), Some(2), "the snapshot's last entry");
        assert_eq!(log.term(8), Some(3));
        assert_eq!(log.term(10), None);
        assert_eq!(log.term(u64::MAX), None);
        assert!(log.entry(u64::MAX).is_none());
        assert!(log.is_up_to_date(9, 4) && log.is_up_to_date(1, 5) && !log.is_up_to_date(100, 3));
    }

    #[test]
    fn find_conflict_by_term_walks_back_to_a_lower_term() {
        let log = log_with_terms((0, 0), &[1, 1, 2, 2, 2, 5, 5]);
        assert_eq!(log.find_conflict_by_term(7, 5), 7);
        assert_eq!(log.find_conflict_by_term(7, 4), 5);
        assert_eq!(log.find_conflict_by_term(7, 1), 2);
        assert_eq!(log.find_conflict_by_term(7, 0), 0);
        assert_eq!(log.find_conflict_by_term(100, 2), 5, "clamped to the last index");
        let compacted = log_with_terms((3, 2), &[3, 3]);
        assert_eq!(compacted.find_conflict_by_term(5, 1), 2, "stops where terms are unknown");
    }

    #[test]
    fn slice_honours_entry_and_byte_limits() {
        let log = log_with_terms((0, 0), &[1; 10]);
        assert_eq!(log.slice(1, 10, 3, u64::MAX).len(), 3);
        assert_eq!(log.slice(1, 10, 100, 25).len(), 2);
        assert_eq!(log.slice(1, 10, 100, 1).len(), 1, "at least one entry");
        assert_eq!(log.slice(8, 100, 100, u64::MAX).len(), 3);
        assert!(log.slice(11, 20, 100, u64::MAX).is_empty());
    }

    #[test]
    fn truncation_pulls_back_stable_and_persisted() {
        let mut log = log_with_terms((0, 0), &[1, 1, 1, 1]);
        assert_eq!((log.stable, log.persisted), (4, 4));
        log.truncate_from(3);
        assert_eq!((log.last_index(), log.stable, log.persisted), (2, 2, 2));
        log.push(Entry { term: 2, index: 3, kind: EntryKind::Normal, data: vec![].into() });
        assert!(log.has_unstable());
        assert_eq!(log.take_unstable().len(), 1);
        assert_eq!(log.persisted, 2);
        log.check();
    }
}
