//! Epochs, message headers and votes, and their one-word encodings
//! (acuerdo §3.1, Fig. 1).
//!
//! # Encoding (one little-endian `u64` word, so the fabric never tears it)
//! ```text
//! bit 63            40 39      32 31                               0
//!     +---------------+----------+---------------------------------+
//!     | round (24 bit)| ldr (8)  | count (32 bit)                  |
//!     +---------------+----------+---------------------------------+
//! ```
//! An [`Epoch`] is a header with count 0. The numeric order of the words
//! is the lexicographic order of `(round, leader, count)`, i.e. the paper's
//! order of epochs and headers ("all tuples are ordered by values left to
//! right"). The all-zero word is [`Header::NONE`] / [`Epoch::NONE`]: nothing
//! accepted, committed or proposed yet (zeroed memory reads as "nothing").
//! Limits (asserted): rounds below 2^24, member ids below 256, counts below
//! 2^32.
//!
//! A [`Vote`] `(e_new, acpt)` needs two words; it is stored with a third,
//! check word (a mix of the two) so a reader that sees a torn vote (one
//! word of an older push, one of a newer) rejects it and keeps the last
//! whole vote it read from that row.

use ordo_fabric::MemberId;
use std::fmt;

/// Largest member id an epoch can name.
pub const MAX_MEMBER_ID: MemberId = 255;
/// Largest round an epoch can carry.
pub const MAX_ROUND: u32 = (1 << 24) - 1;

/// An epoch `(round, leader)`: a period of sovereignty of one leader.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Epoch {
    /// Increasing round number.
    pub round: u32,
    /// The leader of the epoch.
    pub leader: MemberId,
}

impl Epoch {
    /// No epoch (all zero).
    pub const NONE: Epoch = Epoch { round: 0, leader: 0 };

    /// The epoch `(round, leader)`; panics beyond the encoding's limits.
    pub fn new(round: u32, leader: MemberId) -> Epoch {
        assert!(round <= MAX_ROUND, "round {round} exceeds {MAX_ROUND}");
        assert!(leader <= MAX_MEMBER_ID, "member id {leader} exceeds {MAX_MEMBER_ID}");
        Epoch { round, leader }
    }

    /// The header `(self, count)`.
    pub fn header(self, count: u32) -> Header {
        Header { epoch: self, count }
    }

    /// The one-word encoding (`header(0)`).
    pub fn encode(self) -> u64 {
        self.header(0).encode()
    }

    /// The smallest epoch led by `me` that is greater than `than`
    /// (`new_bigger_epoch` of Fig. 7).
    pub fn next_for(than: Epoch, me: MemberId) -> Epoch {
        if me > than.leader { Epoch::new(than.round, me) } else { Epoch::new(than.round + 1, me) }
    }
}

impl fmt::Debug for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({},{})", self.round, self.leader)
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A message header `(epoch, count)`; count 0 is the epoch's diff.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Header {
    /// The epoch the message was proposed in.
    pub epoch: Epoch,
    /// Number of the message within the epoch (from 1; 0 = the diff).
    pub count: u32,
}

impl Header {
    /// Nothing (all zero).
    pub const NONE: Header = Header { epoch: Epoch::NONE, count: 0 };

    /// The one-word encoding (see the module docs).
    pub fn encode(self) -> u64 {
        (u64::from(self.epoch.round) << 40) | (u64::from(self.epoch.leader) << 32) | u64::from(self.count)
    }

    /// Decodes a word written by [`encode`](Self::encode). Every word decodes
    /// to some header (a lying peer can only make up headers, not crash us).
    pub fn decode(word: u64) -> Header {
        Header {
            epoch: Epoch { round: (word >> 40) as u32, leader: ((word >> 32) & 0xFF) as MemberId },
            count: word as u32,
        }
    }

    /// The next header of the same epoch.
    pub fn succ(self) -> Header {
        Header { epoch: self.epoch, count: self.count.checked_add(1).expect("count overflow") }
    }
}

impl fmt::Debug for Header {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({:?},{})", self.epoch, self.count)
    }
}

impl fmt::Display for Header {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A vote `(e_new, acpt)`: the proposed epoch (whose leader is the
/// candidate) and the candidate's last accepted header (Fig. 1, line 6).
/// Ordered lexicographically.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Debug)]
pub struct Vote {
    /// The proposed epoch.
    pub e_new: Epoch,
    /// The candidate's last accepted header.
    pub acpt: Header,
}

impl Vote {
    /// No vote.
    pub const NONE: Vote = Vote { e_new: Epoch::NONE, acpt: Header::NONE };

    /// Whether this is no vote.
    pub fn is_none(&self) -> bool {
        *self == Vote::NONE
    }

    /// The candidate.
    pub fn candidate(&self) -> MemberId {
        self.e_new.leader
    }

    /// The three stored words `[e_new, acpt, check]` (all zero for no vote).
    pub fn encode(self) -> [u64; 3] {
        if self.is_none() {
            return [0; 3];
        }
        let (a, b) = (self.e_new.encode(), self.acpt.encode());
        [a, b, check_word(a, b)]
    }

    /// Decodes three words: `Some(vote)` when they are whole (the check
    /// word matches, or all are zero: no vote), `None` when torn.
    pub fn decode(words: [u64; 3]) -> Option<Vote> {
        if words == [0; 3] {
            return Some(Vote::NONE);
        }
        (check_word(words[0], words[1]) == words[2])
            .then(|| Vote { e_new: Header::decode(words[0]).epoch, acpt: Header::decode(words[1]) })
    }
}

/// A 64-bit mix of the two vote words; never zero.
fn check_word(a: u64, b: u64) -> u64 {
    let mut x = a ^ b.rotate_left(29) ^ 0x9E37_79B9_7F4A_7C15;
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (x ^ (x >> 31)) | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_keeps_the_lexicographic_order() {
        let hs = [
            Header::NONE,
            Epoch::new(0, 1).header(0),
            Epoch::new(0, 1).header(1),
            Epoch::new(0, 1).header(u32::MAX),
            Epoch::new(0, 2).header(0),
            Epoch::new(1, 0).header(0),
            Epoch::new(1, 0).header(7),
            Epoch::new(MAX_ROUND, MAX_MEMBER_ID).header(u32::MAX),
        ];
        for w in hs.windows(2) {
            assert!(w[0] < w[1] && w[0].encode() < w[1].encode(), "{:?} {:?}", w[0], w[1]);
        }
        for h in hs {
            assert_eq!(Header::decode(h.encode()), h);
        }
    }

    #[test]
    fn next_epoch_is_the_smallest_bigger_one() {
        assert_eq!(Epoch::next_for(Epoch::NONE, 0), Epoch::new(1, 0));
        assert_eq!(Epoch::next_for(Epoch::NONE, 1), Epoch::new(0, 1));
        assert_eq!(Epoch::next_for(Epoch::new(0, 1), 2), Epoch::new(0, 2));
        assert_eq!(Epoch::next_for(Epoch::new(0, 2), 1), Epoch::new(1, 1));
    }

    #[test]
    fn torn_votes_are_rejected() {
        let v1 = Vote { e_new: Epoch::new(0, 3), acpt: Epoch::new(0, 1).header(9) };
        let v2 = Vote { e_new: Epoch::new(1, 2), acpt: Epoch::new(0, 1).header(2) };
        let (a, b) = (v1.encode(), v2.encode());
        assert_eq!(Vote::decode(a), Some(v1));
        assert_eq!(Vote::decode([0; 3]), Some(Vote::NONE));
        assert_eq!(Vote::decode([b[0], a[1], a[2]]), None);
        assert_eq!(Vote::decode([b[0], a[1], b[2]]), None);
        assert_eq!(Vote::decode([a[0], b[1], b[2]]), None);
    }
}
