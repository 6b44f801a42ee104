//! A linearizability checker for key-value histories (Wing & Gong's search
//! with Lowe's memoization, as porcupine does it), applied per key: every
//! operation touches one key, and linearizability is compositional, so a
//! history is linearizable iff each key's sub-history is.
//!
//! A history is a list of [`Op`]s with invocation and response times (any
//! monotonic clock shared by the clients). An operation whose outcome the
//! client does not know (a timeout, a broken connection, `TRYAGAIN ...
//! unknown`) has no response time: it may take effect at any point after
//! its invocation, or never. An operation that certainly failed (refused,
//! not applied) must be left out of the history.
//!
//! # Invariants
//! - The search is exhaustive within its step budget: `Linearizable` and
//!   `Violation` are proofs; a search that runs out of budget says
//!   `Unknown`, never a guess.

use std::collections::{HashMap, HashSet};

/// What an operation did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// Set the value (`None`: delete).
    Write(Option<Vec<u8>>),
    /// Read, and saw this (`None`: absent).
    Read(Option<Vec<u8>>),
    /// Compare-and-set: `expected` → `new`, and whether it swapped.
    Cas {
        /// The value expected.
        expected: Option<Vec<u8>>,
        /// The value set if it matched.
        new: Vec<u8>,
        /// Whether it swapped.
        swapped: bool,
    },
}

/// One client operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    /// The key.
    pub key: Vec<u8>,
    /// Invocation time.
    pub call: u64,
    /// Response time (`None`: outcome unknown).
    pub ret: Option<u64>,
    /// What it did.
    pub kind: OpKind,
}

/// The checker's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every key's history has a linearization.
    Linearizable,
    /// This key's history has none.
    Violation {
        /// The key.
        key: Vec<u8>,
        /// Operations on it.
        ops: usize,
    },
    /// The search ran out of budget on this key.
    Unknown {
        /// The key.
        key: Vec<u8>,
    },
}

/// Checks `history`, spending at most `budget` search steps per key.
pub fn check(history: &[Op], budget: u64) -> Verdict {
    let mut by_key: HashMap<&[u8], Vec<&Op>> = HashMap::new();
    for op in history {
        by_key.entry(&op.key).or_default().push(op);
    }
    let mut keys: Vec<&[u8]> = by_key.keys().copied().collect();
    keys.sort();
    let mut unknown = None;
    for key in keys {
        match check_key(&by_key[key], budget) {
            Some(true) => {}
            Some(false) => return Verdict::Violation { key: key.to_vec(), ops: by_key[key].len() },
            None => unknown = unknown.or(Some(key.to_vec())),
        }
    }
    match unknown {
        Some(key) => Verdict::Unknown { key },
        None => Verdict::Linearizable,
    }
}

/// Interned operation on one register (values as small ids; 0 = absent).
#[derive(Clone, Copy)]
enum Step {
    Write(u32),
    Read(u32),
    Cas { expected: u32, new: u32, swapped: bool },
}

fn apply(state: u32, s: Step) -> Option<u32> {
    match s {
        Step::Write(v) => Some(v),
        Step::Read(v) => (v == state).then_some(state),
        Step::Cas { expected, new, swapped: true } => (state == expected).then_some(new),
        Step::Cas { expected, swapped: false, .. } => (state != expected).then_some(state),
    }
}

/// One key: `Some(linearizable)`, or None when out of budget.
fn check_key(ops: &[&Op], budget: u64) -> Option<bool> {
    let mut values: HashMap<Vec<u8>, u32> = HashMap::new();
    let mut intern = |v: &Option<Vec<u8>>| match v {
        None => 0,
        Some(v) => {
            let n = values.len() as u32 + 1;
            *values.entry(v.clone()).or_insert(n)
        }
    };
    let steps: Vec<Step> = ops
        .iter()
        .map(|o| match &o.kind {
            OpKind::Write(v) => Step::Write(intern(v)),
            OpKind::Read(v) => Step::Read(intern(v)),
            OpKind::Cas { expected, new, swapped } => {
                Step::Cas { expected: intern(expected), new: intern(&Some(new.clone())), swapped: *swapped }
            }
        })
        .collect();
    // Events: (time, is_return, op). Calls sort before returns at equal
    // times (the operations then overlap: the more permissive reading).
    let mut events: Vec<(u64, bool, usize)> = Vec::new();
    for (i, o) in ops.iter().enumerate() {
        events.push((o.call, false, i));
        if let Some(r) = o.ret {
            events.push((r.max(o.call), true, i));
        }
    }
    events.sort();
    let n = events.len();
    // A doubly linked list over the events; index n is the head sentinel,
    // usize::MAX the end.
    let mut next: Vec<usize> = (0..=n)
        .map(|i| {
            if i == n {
                if n == 0 { usize::MAX } else { 0 }
            } else if i + 1 < n {
                i + 1
            } else {
                usize::MAX
            }
        })
        .collect();
    let prev: Vec<usize> = (0..=n).map(|i| if i == 0 || i == n { n } else { i - 1 }).collect();
    let mut prev = prev;
    let mut ret_of = vec![usize::MAX; ops.len()];
    for (e, (_, is_ret, op)) in events.iter().enumerate() {
        if *is_ret {
            ret_of[*op] = e;
        }
    }
    let unlink = |e: usize, next: &mut Vec<usize>, prev: &mut Vec<usize>| {
        let (p, q) = (prev[e], next[e]);
        next[p] = q;
        if q != usize::MAX {
            prev[q] = p;
        }
    };
    let relink = |e: usize, next: &mut Vec<usize>, prev: &mut Vec<usize>| {
        let (p, q) = (prev[e], next[e]);
        next[p] = e;
        if q != usize::MAX {
            prev[q] = e;
        }
    };
    let words = ops.len().div_ceil(64);
    let mut linearized = vec![0u64; words];
    let mut cache: HashSet<(Vec<u64>, u32)> = HashSet::new();
    let mut stack: Vec<(usize, u32)> = Vec::new();
    let mut state = 0u32;
    let mut entry = next[n];
    let mut spent = 0u64;
    loop {
        spent += 1;
        if spent > budget {
            return None;
        }
        if entry == usize::MAX {
            // Only calls of operations with unknown outcomes are left (or
            // nothing): they need not take effect.
            return Some(true);
        }
        let (_, is_ret, op) = events[entry];
        if !is_ret {
            if let Some(s) = apply(state, steps[op]) {
                linearized[op / 64] |= 1 << (op % 64);
                if cache.insert((linearized.clone(), s)) {
                    stack.push((entry, state));
                    state = s;
                    unlink(entry, &mut next, &mut prev);
                    if ret_of[op] != usize::MAX {
                        unlink(ret_of[op], &mut next, &mut prev);
                    }
                    entry = next[n];
                    continue;
                }
                linearized[op / 64] &= !(1 << (op % 64));
            }
            entry = next[entry];
        } else {
            // The response of an operation not yet linearized: undo the
            // last choice and try the next candidate.
            let Some((e, s)) = stack.pop() else { return Some(false) };
            let op = events[e].2;
            state = s;
            linearized[op / 64] &= !(1 << (op % 64));
            if ret_of[op] != usize::MAX {
                relink(ret_of[op], &mut next, &mut prev);
            }
            relink(e, &mut next, &mut prev);
            entry = next[e];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(call: u64, ret: Option<u64>, v: &str) -> Op {
        Op { key: b"k".to_vec(), call, ret, kind: OpKind::Write(Some(v.as_bytes().to_vec())) }
    }
    fn r(call: u64, ret: u64, v: Option<&str>) -> Op {
        Op { key: b"k".to_vec(), call, ret: Some(ret), kind: OpKind::Read(v.map(|v| v.as_bytes().to_vec())) }
    }

    #[test]
    fn sequential_and_concurrent_histories() {
        assert_eq!(check(&[w(0, Some(1), "a"), r(2, 3, Some("a"))], 1 << 20), Verdict::Linearizable);
        // Concurrent write: the read may see either.
        assert_eq!(check(&[w(0, Some(10), "a"), r(2, 3, Some("a"))], 1 << 20), Verdict::Linearizable);
        assert_eq!(check(&[w(0, Some(10), "a"), r(2, 3, None)], 1 << 20), Verdict::Linearizable);
        // An unknown write may have happened or not.
        assert_eq!(check(&[w(0, None, "a"), r(5, 6, None)], 1 << 20), Verdict::Linearizable);
        assert_eq!(
            check(&[w(0, None, "a"), r(5, 6, Some("a")), r(7, 8, Some("a"))], 1 << 20),
            Verdict::Linearizable
        );
    }

    /// The stale read: a write acknowledged before a read began, and the
    /// read returns the older value.
    #[test]
    fn a_stale_read_is_a_violation() {
        let h = [w(0, Some(1), "a"), w(2, Some(3), "b"), r(4, 5, Some("a"))];
        assert!(matches!(check(&h, 1 << 20), Verdict::Violation { .. }));
        // A value that was never written.
        assert!(matches!(check(&[r(0, 1, Some("x"))], 1 << 20), Verdict::Violation { .. }));
        // Reads going back in time: once a reader saw b, a later read sees a.
        let h = [w(0, Some(1), "a"), w(2, Some(20), "b"), r(3, 4, Some("b")), r(5, 6, Some("a"))];
        assert!(matches!(check(&h, 1 << 20), Verdict::Violation { .. }));
    }

    #[test]
    fn cas_histories() {
        let cas = |call, ret, e: Option<&str>, n: &str, swapped| Op {
            key: b"k".to_vec(),
            call,
            ret: Some(ret),
            kind: OpKind::Cas {
                expected: e.map(|e| e.as_bytes().to_vec()),
                new: n.as_bytes().to_vec(),
                swapped,
            },
        };
        let ok = [w(0, Some(1), "a"), cas(2, 3, Some("a"), "b", true), r(4, 5, Some("b"))];
        assert_eq!(check(&ok, 1 << 20), Verdict::Linearizable);
        let bad = [w(0, Some(1), "a"), cas(2, 3, Some("a"), "b", true), cas(4, 5, Some("a"), "c", true)];
        assert!(matches!(check(&bad, 1 << 20), Verdict::Violation { .. }));
    }

    #[test]
    fn many_concurrent_clients_stay_fast() {
        // 8 clients, 200 rounds each, on a sequentially consistent register
        // (each round overlaps every client's op): linearizable.
        let mut h = Vec::new();
        let mut value = None::<String>;
        for round in 0..200u64 {
            for c in 0..8u64 {
                let t = round * 100;
                if c == 0 {
                    value = Some(format!("v{round}"));
                    h.push(w(t, Some(t + 50), value.as_deref().unwrap()));
                } else {
                    h.push(r(t + 60 + c, t + 70 + c, value.as_deref()));
                }
            }
        }
        assert_eq!(check(&h, 1 << 22), Verdict::Linearizable);
        assert_eq!(check(&h[..0], 10), Verdict::Linearizable);
    }
}
