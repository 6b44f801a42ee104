//! Redis glob patterns for KEYS and SCAN MATCH: `*`, `?`, `[abc]`,
//! `[^a-z]`, and `\` escaping, over bytes. Linear in practice: one
//! backtracking point (the last `*`), so a hostile pattern cannot make a
//! match exponential.

/// Whether `text` matches `pattern`.
pub fn matches(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() {
            match pattern[p] {
                b'*' => {
                    // Collapse runs of stars.
                    while p < pattern.len() && pattern[p] == b'*' {
                        p += 1;
                    }
                    if p == pattern.len() {
                        return true;
                    }
                    star = Some((p, t));
                    continue;
                }
                b'?' => {
                    p += 1;
                    t += 1;
                    continue;
                }
                b'[' => {
                    if let Some((ok, next)) = class(pattern, p, text[t])
                        && ok
                    {
                        p = next;
                        t += 1;
                        continue;
                    }
                }
                b'\\' if p + 1 < pattern.len() => {
                    if pattern[p + 1] == text[t] {
                        p += 2;
                        t += 1;
                        continue;
                    }
                }
                c => {
                    if c == text[t] {
                        p += 1;
                        t += 1;
                        continue;
                    }
                }
            }
        }
        // Mismatch: retry from the last star, one byte further.
        match star {
            Some((sp, st)) => {
                p = sp;
                t = st + 1;
                star = Some((sp, st + 1));
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|c| *c == b'*')
}

/// Matches byte `c` against the class starting at `pattern[start] == b'['`:
/// whether it matched and the index after the class (None: unterminated,
/// then `[` is an ordinary byte that did not match).
fn class(pattern: &[u8], start: usize, c: u8) -> Option<(bool, usize)> {
    let mut i = start + 1;
    let negate = pattern.get(i) == Some(&b'^');
    if negate {
        i += 1;
    }
    let mut hit = false;
    let mut first = true;
    while i < pattern.len() && (pattern[i] != b']' || first) {
        first = false;
        let mut lo = pattern[i];
        if lo == b'\\' && i + 1 < pattern.len() {
            i += 1;
            lo = pattern[i];
        }
        if i + 2 < pattern.len() && pattern[i + 1] == b'-' && pattern[i + 2] != b']' {
            let hi = pattern[i + 2];
            let (a, b) = if lo <= hi { (lo, hi) } else { (hi, lo) };
            hit |= (a..=b).contains(&c);
            i += 3;
        } else {
            hit |= lo == c;
            i += 1;
        }
    }
    if i >= pattern.len() {
        return None;
    }
    Some((hit != negate, i + 1))
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn redis_glob_cases() {
        for (p, t, want) in [
            ("*", "anything", true),
            ("user:*", "user:42", true),
            ("user:*", "usr:42", false),
            ("h?llo", "hello", true),
            ("h?llo", "hllo", false),
            ("h[ae]llo", "hallo", true),
            ("h[ae]llo", "hillo", false),
            ("h[^e]llo", "hallo", true),
            ("h[^e]llo", "hello", false),
            ("h[a-b]llo", "hbllo", true),
            ("h\\*llo", "h*llo", true),
            ("h\\*llo", "hello", false),
            ("*a*b*c", "xaybzc", true),
            ("*a*b*c", "xaybz", false),
            ("", "", true),
            ("", "x", false),
            ("[", "[", false),
        ] {
            assert_eq!(matches(p.as_bytes(), t.as_bytes()), want, "{p} vs {t}");
        }
    }

    #[test]
    fn a_hostile_pattern_stays_fast() {
        let text = vec![b'a'; 10_000];
        let pattern = [b"*a".repeat(30), b"b".to_vec()].concat();
        let t = std::time::Instant::now();
        assert!(!matches(&pattern, &text));
        assert!(t.elapsed() < std::time::Duration::from_secs(2));
    }
}
