//! The repairer's source stays a room a newcomer can work in: its modules import each other
//! without circles, no file grows past ~800 lines and no function past ~120 (tests aside).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Circles that the layout asks for, with why.
const ALLOWED_CIRCLES: &[(&str, &str, &str)] = &[(
    "queue",
    "scheduler",
    "scheduler/embedded.rs adapts the queue to the Scheduler trait, whose types the queue speaks",
)];

const MAX_FILE_LINES: usize = 800;
const MAX_FN_LINES: usize = 120;

fn source_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut files);
    files.sort();
    files
}

fn src_relative(path: &Path) -> String {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    path.strip_prefix(&src).unwrap().display().to_string()
}

/// The code of a file: before its unit tests, without comment lines.
fn code(text: &str) -> String {
    let before_tests = text.split("#[cfg(test)]").next().unwrap_or("");
    before_tests
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_test_file(relative: &str) -> bool {
    relative.ends_with("tests.rs") || relative.contains("/tests/")
}

#[test]
fn the_top_level_modules_import_each_other_without_circles() {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in source_files() {
        let relative = src_relative(&file);
        if relative == "lib.rs" || is_test_file(&relative) {
            continue;
        }
        let module = relative.split('/').next().unwrap().trim_end_matches(".rs").to_owned();
        let text = std::fs::read_to_string(&file).unwrap();
        let code = code(&text);
        let deps = graph.entry(module.clone()).or_default();
        for (i, _) in code.match_indices("crate::") {
            let rest = &code[i + "crate::".len()..];
            let dep: String =
                rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if !dep.is_empty() && dep != module {
                deps.insert(dep);
            }
        }
    }
    let allowed = |a: &str, b: &str| {
        ALLOWED_CIRCLES.iter().any(|(x, y, _)| (*x == a && *y == b) || (*x == b && *y == a))
    };
    let mut circles = Vec::new();
    for start in graph.keys() {
        // Every path back to `start`, a module at a time.
        let mut stack = vec![vec![start.clone()]];
        while let Some(path) = stack.pop() {
            let last = path.last().unwrap();
            for dep in graph.get(last).into_iter().flatten() {
                if dep == start {
                    let two = path.len() == 2 && allowed(&path[0], &path[1]);
                    if !two {
                        circles.push(path.join(" -> ") + " -> " + start);
                    }
                } else if !path.contains(dep) && path.len() < graph.len() {
                    let mut longer = path.clone();
                    longer.push(dep.clone());
                    stack.push(longer);
                }
            }
        }
    }
    assert!(circles.is_empty(), "modules import each other in a circle:\n{}", circles.join("\n"));
}

#[test]
fn no_file_is_past_800_lines_and_no_function_past_120() {
    let mut too_long = Vec::new();
    for file in source_files() {
        let relative = src_relative(&file);
        let text = std::fs::read_to_string(&file).unwrap();
        let lines = text.lines().count();
        if lines > MAX_FILE_LINES {
            too_long.push(format!("{relative}: {lines} lines"));
        }
        if is_test_file(&relative) {
            continue;
        }
        let code: Vec<&str> = text.split("#[cfg(test)]").next().unwrap_or("").lines().collect();
        for (start, line) in code.iter().enumerate() {
            let trimmed = line.trim_start();
            let is_fn = [
                "fn ",
                "pub fn ",
                "pub(crate) fn ",
                "pub(super) fn ",
                "async fn ",
                "pub async fn ",
            ]
            .iter()
            .any(|p| trimmed.starts_with(p));
            if !is_fn || trimmed.ends_with(';') {
                continue;
            }
            let indent = &line[..line.len() - trimmed.len()];
            let end = code[start..].iter().position(|l| *l == format!("{indent}}}"));
            if let Some(length) = end
                && length > MAX_FN_LINES
            {
                too_long.push(format!("{relative}:{}: {} is {length} lines", start + 1, trimmed));
            }
        }
    }
    assert!(too_long.is_empty(), "past the limits:\n{}", too_long.join("\n"));
}
