//! The message log (Fig. 1's `Log`): bodies by header, in header order.
//!
//! Headers arrive almost always in order (a leader's broadcasts, a ring in
//! order, a diff in order) and leave from the front (garbage collection,
//! [`super::gc`]) or from a suffix (a diff replacing the uncommitted tail),
//! so the log is a sorted deque: appending, dropping the oldest and finding
//! a header by binary search touch contiguous memory and allocate nothing
//! in the steady state. It replaced a `BTreeMap`, whose node walks were a
//! fifth of a window-1 commit's CPU time.
//!
//! # Invariants
//! - Headers are strictly increasing from front to back (asserted by every
//!   operation that could break it, checked in full by the unit tests).

use crate::header::Header;
use std::collections::VecDeque;
use std::ops::{Bound, RangeBounds};

/// Bodies by header, in strictly increasing header order.
#[derive(Default, Debug)]
pub(super) struct Log {
    entries: VecDeque<(Header, Vec<u8>)>,
}

impl Log {
    /// Where `h` is, or would be inserted.
    fn position(&self, h: Header) -> Result<usize, usize> {
        // The common lookups are at the back (the newest entries).
        let len = self.entries.len();
        match self.entries.back() {
            None => Err(0),
            Some((last, _)) if *last < h => Err(len),
            Some((last, _)) if *last == h => Ok(len - 1),
            Some((last, _)) => {
                // Within one epoch the log is usually gap-free, so `h` sits
                // as far from the back as its count is from the last one.
                if last.epoch == h.epoch
                    && let Some(i) = (len - 1).checked_sub((last.count - h.count) as usize)
                    && self.entries[i].0 == h
                {
                    return Ok(i);
                }
                self.entries.binary_search_by(|(k, _)| k.cmp(&h))
            }
        }
    }

    /// Index of the first entry inside `bound` taken as a lower bound.
    fn lower(&self, bound: Bound<&Header>) -> usize {
        match bound {
            Bound::Unbounded => 0,
            Bound::Included(h) => self.position(*h).unwrap_or_else(|i| i),
            Bound::Excluded(h) => self.position(*h).map_or_else(|i| i, |i| i + 1),
        }
    }

    /// Index one past the last entry inside `bound` taken as an upper bound.
    fn upper(&self, bound: Bound<&Header>) -> usize {
        match bound {
            Bound::Unbounded => self.entries.len(),
            Bound::Included(h) => self.position(*h).map_or_else(|i| i, |i| i + 1),
            Bound::Excluded(h) => self.position(*h).unwrap_or_else(|i| i),
        }
    }

    /// Stores `body` under `h`; returns the body it replaced.
    pub(super) fn insert(&mut self, h: Header, body: Vec<u8>) -> Option<Vec<u8>> {
        match self.position(h) {
            Ok(i) => Some(std::mem::replace(&mut self.entries[i].1, body)),
            Err(i) if i == self.entries.len() => {
                self.entries.push_back((h, body)); // the common case: the newest entry
                None
            }
            Err(i) => {
                self.entries.insert(i, (h, body));
                debug_assert!(i == 0 || self.entries[i - 1].0 < h, "the log stays sorted");
                None
            }
        }
    }

    /// The body of `h`.
    pub(super) fn get(&self, h: &Header) -> Option<&Vec<u8>> {
        self.position(*h).ok().map(|i| &self.entries[i].1)
    }

    /// Whether `h` is in the log.
    pub(super) fn contains_key(&self, h: &Header) -> bool {
        self.position(*h).is_ok()
    }

    /// The entries whose headers lie in `range`, in order.
    pub(super) fn range(&self, range: impl RangeBounds<Header>) -> impl Iterator<Item = (&Header, &Vec<u8>)> {
        let from = self.lower(range.start_bound());
        let to = self.upper(range.end_bound()).max(from);
        self.entries.range(from..to).map(|(h, b)| (h, b))
    }

    /// The first entry after `after`.
    pub(super) fn first_after(&self, after: Header) -> Option<(&Header, &Vec<u8>)> {
        self.entries.get(self.lower(Bound::Excluded(&after))).map(|(h, b)| (h, b))
    }

    /// Drops every entry at or above `h`.
    pub(super) fn truncate_from(&mut self, h: Header) {
        let i = self.lower(Bound::Included(&h));
        self.entries.truncate(i);
    }

    /// The oldest entry.
    pub(super) fn first_key_value(&self) -> Option<(&Header, &Vec<u8>)> {
        self.entries.front().map(|(h, b)| (h, b))
    }

    /// The newest entry.
    pub(super) fn last_key_value(&self) -> Option<(&Header, &Vec<u8>)> {
        self.entries.back().map(|(h, b)| (h, b))
    }

    /// Removes the oldest entry.
    pub(super) fn pop_first(&mut self) -> Option<(Header, Vec<u8>)> {
        self.entries.pop_front()
    }

    /// Headers in order.
    pub(super) fn keys(&self) -> impl Iterator<Item = &Header> {
        self.entries.iter().map(|(h, _)| h)
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub(super) fn clear(&mut self) {
        self.entries.clear();
    }
}

impl std::ops::Index<&Header> for Log {
    type Output = Vec<u8>;
    fn index(&self, h: &Header) -> &Vec<u8> {
        self.get(h).expect("the header is in the log")
    }
}

impl FromIterator<(Header, Vec<u8>)> for Log {
    fn from_iter<I: IntoIterator<Item = (Header, Vec<u8>)>>(iter: I) -> Self {
        let mut log = Log::default();
        for (h, b) in iter {
            log.insert(h, b);
        }
        log
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::Epoch;
    use std::collections::BTreeMap;

    /// The log answers every query as a `BTreeMap` would, under a random
    /// mix of in-order appends, out-of-order inserts, replacements,
    /// truncations and pops.
    #[test]
    fn behaves_like_an_ordered_map() {
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let h = |e: u64, c: u64| Epoch::new(e as u32, (e % 3) as u32).header(c as u32);
        let mut log = Log::default();
        let mut map = BTreeMap::new();
        for step in 0..20_000u64 {
            let k = h(next(4), next(40));
            match next(10) {
                0..=4 => {
                    let k = map.last_key_value().map_or(h(0, 1), |(l, _): (&Header, _)| l.succ());
                    assert_eq!(log.insert(k, vec![step as u8]), map.insert(k, vec![step as u8]));
                }
                5 | 6 => assert_eq!(log.insert(k, vec![step as u8]), map.insert(k, vec![step as u8])),
                7 => {
                    log.truncate_from(k);
                    let _ = map.split_off(&k);
                }
                8 => assert_eq!(log.pop_first(), map.pop_first()),
                _ => {
                    let k2 = h(next(4), next(40));
                    let want: Vec<_> = map.range((Bound::Excluded(k), Bound::Included(k2.max(k)))).collect();
                    let got: Vec<_> = log.range((Bound::Excluded(k), Bound::Included(k2.max(k)))).collect();
                    assert_eq!(got, want);
                    assert_eq!(log.first_after(k), map.range((Bound::Excluded(k), Bound::Unbounded)).next());
                }
            }
            assert_eq!(log.get(&k), map.get(&k));
            assert_eq!(log.contains_key(&k), map.contains_key(&k));
            assert_eq!(log.len(), map.len());
            assert_eq!(log.first_key_value(), map.first_key_value());
            assert_eq!(log.last_key_value(), map.last_key_value());
        }
        assert!(log.keys().zip(log.keys().skip(1)).all(|(a, b)| a < b), "strictly increasing");
        assert_eq!(log.keys().collect::<Vec<_>>(), map.keys().collect::<Vec<_>>());
    }
}
