//! Slurm's hostlist syntax: `gpu-[001-128]`, `gpu-[001-004,010],cpu[1-3]`, `rack[1-2]-n[01-04]`.
//!
//! A list is names and patterns separated by commas outside brackets. A pattern is text with
//! bracketed sets of numbers or ranges (`[1-3,7]`); several brackets give every combination, in
//! order. A range keeps the width of its low bound (`[008-010]` → 008 009 010), as Slurm does.
//! Every name that comes out must be a node name the repairer accepts in a report.

use std::fmt;

/// Most names one list may expand to: a typo such as `gpu-[1-999999999]` is an error, not a
/// repairer that runs out of memory.
pub const MAX_NAMES: usize = 1_000_000;

/// A list that is not Slurm's hostlist syntax, with the character position (1-based) it went
/// wrong at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct HostlistError {
    pub list: String,
    /// 1-based position of the offending character (or of the end of the list).
    pub position: usize,
    pub problem: String,
}

impl fmt::Display for HostlistError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {} at position {}", self.list, self.problem, self.position)
    }
}

/// A bracket's range: low, high and the width of the low bound in digits.
type Range = (u64, u64, usize);

/// A problem in a pattern: the index of the character and what is wrong.
type Problem = (usize, String);

/// One piece of a pattern: literal text, or a bracketed set of ranges.
#[derive(Debug)]
enum Piece {
    Text(String),
    Set(Vec<Range>),
}

/// Expands `list` into its names, in order, each once.
pub fn expand(list: &str) -> Result<Vec<String>, HostlistError> {
    let chars: Vec<char> = list.chars().collect();
    let error = |at: usize, problem: String| HostlistError {
        list: list.to_owned(),
        position: at + 1,
        problem,
    };
    let mut names = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut start = 0;
    while start <= chars.len() {
        // The pattern runs to the next comma outside brackets.
        let mut end = start;
        let mut depth = 0;
        while end < chars.len() && !(chars[end] == ',' && depth == 0) {
            match chars[end] {
                '[' => depth += 1,
                ']' => depth = 0,
                _ => {}
            }
            end += 1;
        }
        if end == start {
            let problem = if chars.is_empty() { "an empty list" } else { "an empty name" };
            return Err(error(start, problem.to_owned()));
        }
        let pieces = pieces(&chars, start, end).map_err(|(at, p)| error(at, p))?;
        for name in combinations(&pieces, names.len()).map_err(|p| error(start, p))? {
            if !crate::identity::is_node_name(&name) {
                return Err(error(start, format!("{name:?} is not a node name")));
            }
            if seen.insert(name.clone()) {
                names.push(name);
            }
        }
        start = end + 1;
    }
    Ok(names)
}

/// The pieces of the pattern `chars[start..end]`; an error is (index, problem).
fn pieces(chars: &[char], start: usize, end: usize) -> Result<Vec<Piece>, Problem> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut i = start;
    while i < end {
        let c = chars[i];
        match c {
            '[' => {
                let close = (i + 1..end)
                    .find(|&j| chars[j] == ']')
                    .ok_or((i, "a '[' that is never closed".to_owned()))?;
                if let Some(nested) = (i + 1..close).find(|&j| chars[j] == '[') {
                    return Err((nested, "a '[' inside brackets".to_owned()));
                }
                pieces.push(Piece::Text(std::mem::take(&mut text)));
                pieces.push(Piece::Set(set(chars, i + 1, close)?));
                i = close + 1;
            }
            ']' => return Err((i, "a ']' with no '[' before it".to_owned())),
            c if c.is_ascii_alphanumeric() || "-._".contains(c) => {
                text.push(c);
                i += 1;
            }
            c => return Err((i, format!("{c:?} cannot be in a node name"))),
        }
    }
    pieces.push(Piece::Text(text));
    Ok(pieces)
}

/// The numbers of a bracket's inside `chars[start..end]`: `1-3,7` → (1, 3, width 1), (7, 7, 1).
fn set(chars: &[char], start: usize, end: usize) -> Result<Vec<Range>, Problem> {
    let mut ranges = Vec::new();
    let mut i = start;
    loop {
        let (low, width, after) = number(chars, i, end)?;
        let (high, after) = if after < end && chars[after] == '-' {
            let (high, _, after) = number(chars, after + 1, end)?;
            if high < low {
                return Err((i, format!("the range {low}-{high} runs backwards")));
            }
            (high, after)
        } else {
            (low, after)
        };
        ranges.push((low, high, width));
        if after == end {
            return Ok(ranges);
        }
        if chars[after] != ',' {
            return Err((after, format!("{:?} where a ',' or ']' was expected", chars[after])));
        }
        i = after + 1;
    }
}

/// The number starting at `chars[at]`: its value, its width in digits and where it ends.
fn number(chars: &[char], at: usize, end: usize) -> Result<(u64, usize, usize), Problem> {
    let digits = (at..end).take_while(|&j| chars[j].is_ascii_digit()).count();
    if digits == 0 {
        let found = if at < end { format!("{:?}", chars[at]) } else { "']'".to_owned() };
        return Err((at, format!("{found} where a number was expected")));
    }
    let text: String = chars[at..at + digits].iter().collect();
    let value = text.parse().map_err(|_| (at, format!("{text} is too large a number")))?;
    Ok((value, digits, at + digits))
}

/// Every name of the pieces, in order; an error when the list (with `already` names before) would
/// pass [`MAX_NAMES`].
fn combinations(pieces: &[Piece], already: usize) -> Result<Vec<String>, String> {
    let mut count: u128 = 1;
    for piece in pieces {
        if let Piece::Set(ranges) = piece {
            let size: u128 = ranges.iter().map(|(low, high, _)| u128::from(high - low) + 1).sum();
            count = count.saturating_mul(size);
        }
    }
    if count.saturating_add(already as u128) > MAX_NAMES as u128 {
        return Err(format!("expands to more than {MAX_NAMES} names"));
    }
    let mut names = vec![String::new()];
    for piece in pieces {
        names = match piece {
            Piece::Text(text) => names.into_iter().map(|n| n + text).collect(),
            Piece::Set(ranges) => names
                .iter()
                .flat_map(|prefix| {
                    ranges.iter().flat_map(move |&(low, high, width)| {
                        (low..=high).map(move |n| format!("{prefix}{n:0width$}"))
                    })
                })
                .collect(),
        };
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_expand_to_their_names_in_order() {
        let cases: &[(&str, &str, &[&str])] = &[
            ("a plain name", "gpu-001", &["gpu-001"]),
            ("a range", "cpu[1-3]", &["cpu1", "cpu2", "cpu3"]),
            (
                "zero padding kept from the low bound",
                "gpu-[008-010]",
                &["gpu-008", "gpu-009", "gpu-010"],
            ),
            ("a range that outgrows its width", "n[8-10]", &["n8", "n9", "n10"]),
            ("single numbers and ranges", "gpu-[001-002,010]", &["gpu-001", "gpu-002", "gpu-010"]),
            (
                "several patterns, commas inside brackets kept",
                "gpu-[001-002,010],cpu[1-2]",
                &["gpu-001", "gpu-002", "gpu-010", "cpu1", "cpu2"],
            ),
            ("text after the bracket", "n[1-2]-ib", &["n1-ib", "n2-ib"]),
            (
                "several brackets: every combination",
                "r[1-2]-n[01-02]",
                &["r1-n01", "r1-n02", "r2-n01", "r2-n02"],
            ),
            ("a name given twice is listed once", "n1,n[1-2]", &["n1", "n2"]),
            ("a one-number bracket", "node[7]", &["node7"]),
            ("dots and underscores", "a.b_c[1-1]", &["a.b_c1"]),
        ];
        for (case, list, want) in cases {
            let got = expand(list).unwrap_or_else(|e| panic!("{case}: {e}"));
            assert_eq!(got, *want, "{case}");
        }
        assert_eq!(expand("gpu-[001-128]").unwrap().len(), 128);
        assert_eq!(expand("gpu-[001-128]").unwrap()[127], "gpu-128");
    }

    #[test]
    fn bad_lists_are_refused_naming_the_position() {
        let cases: &[(&str, &str, usize, &str)] = &[
            ("an unclosed bracket", "gpu-[001-004", 5, "never closed"),
            ("a stray closing bracket", "gpu-001]", 8, "no '['"),
            ("a nested bracket", "gpu-[1-[2]]", 8, "inside brackets"),
            ("a range backwards", "gpu-[9-3]", 6, "backwards"),
            ("a letter in a range", "gpu-[1-a]", 8, "number was expected"),
            ("an empty bracket", "gpu-[]", 6, "number was expected"),
            ("a range with no end", "gpu-[1-]", 8, "number was expected"),
            ("a space in a name", "gpu 1", 4, "cannot be in a node name"),
            ("a slash in a name", "a/b", 2, "cannot be in a node name"),
            ("an empty name between commas", "a,,b", 3, "an empty name"),
            ("a trailing comma", "a,", 3, "an empty name"),
            ("an empty list", "", 1, "an empty list"),
            ("a separator inside a bracket", "n[1;2]", 4, "',' or ']' was expected"),
            ("too many names", "n[0-999999999]", 1, "more than 1000000 names"),
            ("a number too large", "n[99999999999999999999]", 3, "too large"),
        ];
        for (case, list, position, problem) in cases {
            let err = expand(list).expect_err(case);
            assert_eq!(err.position, *position, "{case}: {err}");
            assert!(err.problem.contains(problem), "{case}: {err}");
            let shown = err.to_string();
            assert!(shown.contains(&format!("position {position}")), "{case}: {shown}");
        }
    }
}
