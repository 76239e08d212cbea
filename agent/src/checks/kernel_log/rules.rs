//! Kernel-log rules: their config form, the built-in set, validation and compilation.
//!
//! Rules are data (node-problem-detector's model): a regex, the finding it raises, a status and an
//! action, a subject template and a window after which the finding clears. Validation and
//! compilation share [`compile`], so a rule that passed validation compiles the same way in
//! [`super::KernelLogCheck::new`]. The built-in set is in [`builtin`].

mod builtin;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Duration;

use fleetmend_proto::{RecommendedAction, Status};
use regex_automata::meta::{self, Regex};
use regex_automata::util::captures::Captures;
use regex_automata::util::primitives::PatternID;
use regex_automata::util::syntax;
use serde::Deserialize;

pub use self::builtin::builtin_rules;
use crate::xid;

/// Longest label value kept from a capture group; patterns should capture bounded values only, this
/// bounds what a careless pattern can put into a report.
const MAX_LABEL_CHARS: usize = 64;

/// Longest subject built from a template, for the same reason.
const MAX_SUBJECT_CHARS: usize = 128;
// At most four bytes a character: within the wire's bounds.
const _: () = assert!(MAX_LABEL_CHARS * 4 <= fleetmend_proto::bounds::MAX_LABEL_VALUE_BYTES);
/// Named capture groups a rule may have: the wire's labels per finding, less `rule` and `count`.
const MAX_GROUPS: usize = fleetmend_proto::bounds::MAX_LABELS - 2;
const MAX_LABEL_KEY_BYTES: usize = fleetmend_proto::bounds::MAX_LABEL_KEY_BYTES;
const _: () = assert!(MAX_SUBJECT_CHARS * 4 <= fleetmend_proto::bounds::MAX_SUBJECT_BYTES);

/// Most lines one rule may span (`lines`).
pub const MAX_LINES: usize = 4;

/// One kernel-log rule as written in config (`[[checks.kernel_log.rules]]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KernelLogRule {
    /// Unique name of the rule; also the `rule` label of `fleetmend_kmsg_matches_total`. A user rule
    /// with the name of a built-in rule replaces it.
    pub name: String,
    /// Regular expression searched in each kernel-log message (the kmsg prefix removed). Classes
    /// are ASCII (`\d`, `\w`, `\s` and `(?i)` as in Go's regexp). Named capture groups become the
    /// finding's labels: capture bounded values only (codes, addresses, device names), never free
    /// text.
    pub pattern: String,
    /// Finding id reported while the rule is active (short snake_case, e.g. `xid`).
    pub finding: String,
    /// `warn` or `fail`; or `xid-catalog` (from the catalog entry of the captured `xid` group), or
    /// `xid-recovery-action` (from the captured hex `recovery` group, see [`xid::recovery_action`]).
    pub status: String,
    /// `none`, `restart-app`, `reset-gpu`, `reboot`, `replace`, `drain`; or `xid-catalog` /
    /// `xid-recovery-action` as for `status`.
    pub action: String,
    /// Subject template: `${group}` is replaced by that named capture group (e.g. `"${pci}"`);
    /// empty for the node itself.
    pub subject: String,
    /// The finding clears this long after the rule's last match for the subject, so a node does not
    /// stay sick forever on one old line.
    #[serde(with = "humantime_serde")]
    pub clear_after: Duration,
    /// Lines the pattern is matched across (1 to 4): the latest messages joined with `\n`, for a
    /// message the kernel prints over several lines. A match must reach into the newest line, so
    /// the same lines count once.
    pub lines: usize,
    /// A line that says the condition is over (empty: none): matching it clears the rule's
    /// finding on the subject it names (the subject template filled from its groups), without
    /// waiting for `clear_after`. `Link is Up` clears `link_down`.
    pub clear_pattern: String,
}

impl Default for KernelLogRule {
    fn default() -> Self {
        KernelLogRule {
            name: String::new(),
            pattern: String::new(),
            finding: String::new(),
            status: "warn".to_owned(),
            action: "none".to_owned(),
            subject: String::new(),
            clear_after: Duration::from_secs(3600),
            lines: 1,
            clear_pattern: String::new(),
        }
    }
}

/// The rules in effect: the built-ins (when on) with same-named user rules in their place, then the
/// other user rules in order.
pub fn effective_rules(builtins: bool, user: &[KernelLogRule]) -> Vec<KernelLogRule> {
    let mut rules = if builtins { builtin_rules() } else { Vec::new() };
    for rule in user {
        match rules.iter_mut().find(|r| r.name == rule.name) {
            Some(slot) => *slot = rule.clone(),
            None => rules.push(rule.clone()),
        }
    }
    rules
}

/// Where a rule's status comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusSource {
    Fixed(Status),
    XidCatalog,
    RecoveryAction,
}

/// Where a rule's action comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActionSource {
    Fixed(RecommendedAction),
    XidCatalog,
    RecoveryAction,
}

/// A piece of a subject template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum TemplatePart {
    Text(String),
    Group(String),
}

/// A rule ready to match.
#[derive(Debug, Clone)]
pub struct Rule {
    pub name: String,
    pub finding: String,
    regex: Regex,
    status: StatusSource,
    action: ActionSource,
    subject: Vec<TemplatePart>,
    pub clear_after: Duration,
    /// Lines matched across.
    pub lines: usize,
    /// The latest match per subject replaces the earlier ones (a state, like the driver's recovery
    /// action), instead of the worst match in the window winning.
    pub latest_wins: bool,
    /// Lines that clear the condition (`clear_pattern`).
    clear: Option<Regex>,
}

/// What one matching line means.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleMatch {
    pub subject: String,
    pub status: Status,
    pub action: RecommendedAction,
    pub labels: BTreeMap<String, String>,
}

impl Rule {
    /// The match of `text`, if the rule matches it.
    pub fn matches(&self, text: &str) -> Option<RuleMatch> {
        let mut caps = self.regex.create_captures();
        self.regex.captures(text.as_bytes(), &mut caps);
        caps.is_match().then(|| self.found(&Groups { caps: &caps, haystack: text.as_bytes() }))
    }

    /// The first match of `text` that ends after byte `from` (in the newest of joined lines).
    pub fn matches_ending_after(&self, text: &str, from: usize) -> Option<RuleMatch> {
        let caps = self
            .regex
            .captures_iter(text.as_bytes())
            .find(|caps| caps.get_match().is_some_and(|m| m.end() > from))?;
        Some(self.found(&Groups { caps: &caps, haystack: text.as_bytes() }))
    }

    /// The subject a line clears the condition of, if it is a clearing line.
    pub fn clears(&self, text: &str) -> Option<String> {
        let regex = self.clear.as_ref()?;
        let mut caps = regex.create_captures();
        regex.captures(text.as_bytes(), &mut caps);
        caps.is_match().then(|| self.subject_of(&Groups { caps: &caps, haystack: text.as_bytes() }))
    }

    fn found(&self, groups: &Groups<'_>) -> RuleMatch {
        let mut labels = BTreeMap::new();
        for name in group_names(&self.regex) {
            if let Some(text) = groups.get(name) {
                labels.insert(name.to_owned(), truncate_chars(&text, MAX_LABEL_CHARS));
            }
        }
        let (status, action) = self.resolve(groups);
        RuleMatch { subject: self.subject_of(groups), status, action, labels }
    }

    fn resolve(&self, groups: &Groups<'_>) -> (Status, RecommendedAction) {
        let catalog = || {
            // The pattern bounds the digits; a code that still does not parse is "not in the
            // catalog", which is what advice() says for any unknown code.
            let code = groups.get("xid").and_then(|text| text.parse::<u32>().ok());
            let code = code.unwrap_or(u32::MAX);
            let severity = groups.get("severity");
            match severity.and_then(|word| xid::by_severity(code, &word)) {
                Some(decided) => decided,
                None => {
                    let advice = xid::advice(code);
                    (advice.status, advice.action)
                }
            }
        };
        let recovery = || {
            groups
                .get("recovery")
                .and_then(|text| u32::from_str_radix(&text, 16).ok())
                .and_then(xid::recovery_action)
                .map(|(status, action, _)| (status, action))
                // A recovery action this catalog does not know: someone should look.
                .unwrap_or((Status::Warn, RecommendedAction::None))
        };
        let status = match self.status {
            StatusSource::Fixed(status) => status,
            StatusSource::XidCatalog => catalog().0,
            StatusSource::RecoveryAction => recovery().0,
        };
        let action = match self.action {
            ActionSource::Fixed(action) => action,
            ActionSource::XidCatalog => catalog().1,
            ActionSource::RecoveryAction => recovery().1,
        };
        (status, action)
    }

    fn subject_of(&self, groups: &Groups<'_>) -> String {
        let mut subject = String::new();
        for part in &self.subject {
            match part {
                TemplatePart::Text(text) => subject.push_str(text),
                TemplatePart::Group(name) => {
                    subject.push_str(&groups.get(name).unwrap_or_default());
                }
            }
        }
        truncate_chars(&subject, MAX_SUBJECT_CHARS)
    }
}

/// One thing wrong with a rule: the field (`name`, `pattern`, ...) and what.
pub type RuleProblem = (&'static str, String);

/// Compiles `rule`, or every problem with it.
pub fn compile(rule: &KernelLogRule) -> Result<Rule, Vec<RuleProblem>> {
    let mut problems: Vec<RuleProblem> = Vec::new();
    if rule.name.trim().is_empty() {
        problems.push(("name", "must not be empty".to_owned()));
    }
    if !is_snake_case(&rule.finding) {
        problems.push((
            "finding",
            format!("{:?} is not a snake_case finding id (a-z, 0-9, _)", rule.finding),
        ));
    }
    if rule.clear_after.is_zero() {
        problems.push(("clear_after", "must be greater than zero".to_owned()));
    }
    if !(1..=MAX_LINES).contains(&rule.lines) {
        problems.push(("lines", format!("{} is not between 1 and {MAX_LINES}", rule.lines)));
    }
    let status = status_source(&rule.status, &mut problems);
    let action = action_source(&rule.action, &mut problems);
    let regex = pattern_regex(&rule.pattern, &mut problems);
    let subject = match parse_template(&rule.subject) {
        Ok(parts) => Some(parts),
        Err(message) => {
            problems.push(("subject", message));
            None
        }
    };
    if let Some(regex) = &regex {
        check_groups(regex, subject.as_deref(), status, action, &mut problems);
    }
    let clear = clear_regex(&rule.clear_pattern, subject.as_deref(), &mut problems);
    match (regex, status, action, subject) {
        (Some(regex), Some(status), Some(action), Some(subject)) if problems.is_empty() => {
            Ok(Rule {
                name: rule.name.clone(),
                finding: rule.finding.clone(),
                regex,
                status,
                action,
                subject,
                clear_after: rule.clear_after,
                lines: rule.lines,
                latest_wins: status == StatusSource::RecoveryAction,
                clear,
            })
        }
        _ => Err(problems),
    }
}

/// A rule's `status` field, or `None` with the problem noted.
fn status_source(status: &str, problems: &mut Vec<RuleProblem>) -> Option<StatusSource> {
    match status {
        "warn" => Some(StatusSource::Fixed(Status::Warn)),
        "fail" => Some(StatusSource::Fixed(Status::Fail)),
        "xid-catalog" => Some(StatusSource::XidCatalog),
        "xid-recovery-action" => Some(StatusSource::RecoveryAction),
        other => {
            problems.push((
                "status",
                format!(
                    "unknown status {other:?} (expected warn, fail, xid-catalog or xid-recovery-action)"
                ),
            ));
            None
        }
    }
}

/// A rule's `action` field, or `None` with the problem noted.
fn action_source(action: &str, problems: &mut Vec<RuleProblem>) -> Option<ActionSource> {
    match action {
        "xid-catalog" => Some(ActionSource::XidCatalog),
        "xid-recovery-action" => Some(ActionSource::RecoveryAction),
        other => match other.parse::<RecommendedAction>() {
            Ok(action) => Some(ActionSource::Fixed(action)),
            Err(_) => {
                problems.push((
                    "action",
                    format!(
                        "unknown action {other:?} (expected none, restart-app, reset-gpu, reboot, replace, drain, xid-catalog or xid-recovery-action)"
                    ),
                ));
                None
            }
        },
    }
}

/// A rule's `pattern` compiled, or `None` with the problem noted.
fn pattern_regex(pattern: &str, problems: &mut Vec<RuleProblem>) -> Option<Regex> {
    if pattern.is_empty() {
        problems.push(("pattern", "must not be empty".to_owned()));
        return None;
    }
    match build_regex(pattern) {
        Ok(regex) => Some(regex),
        Err(text) => {
            problems.push(("pattern", format!("not a valid regex: {text}")));
            None
        }
    }
}

/// A rule's `clear_pattern` compiled (none when empty), or `None` with the problem noted: it
/// must be a valid regex with every group the subject takes.
fn clear_regex(
    pattern: &str,
    subject: Option<&[TemplatePart]>,
    problems: &mut Vec<RuleProblem>,
) -> Option<Regex> {
    if pattern.is_empty() {
        return None;
    }
    let regex = match build_regex(pattern) {
        Ok(regex) => regex,
        Err(text) => {
            problems.push(("clear_pattern", format!("not a valid regex: {text}")));
            return None;
        }
    };
    for part in subject.into_iter().flatten() {
        if let TemplatePart::Group(name) = part
            && !group_names(&regex).any(|n| n == name)
        {
            problems.push((
                "clear_pattern",
                format!("has no group {name:?}, which the subject takes its value from"),
            ));
        }
    }
    Some(regex)
}

/// The problems with the capture groups of a rule's compiled pattern: too many or too long for
/// labels, or lacking one that the subject, the status or the action takes its value from.
fn check_groups(
    regex: &Regex,
    subject: Option<&[TemplatePart]>,
    status: Option<StatusSource>,
    action: Option<ActionSource>,
    problems: &mut Vec<RuleProblem>,
) {
    // Each named group becomes a label of the finding, beside `rule` (and `count` for a
    // burst): more than the wire allows would be cut at send time, so refuse it here.
    let groups = group_names(regex).count();
    if groups > MAX_GROUPS {
        problems.push((
            "pattern",
            format!("{groups} named capture groups is more than {MAX_GROUPS} (each becomes a label of the finding)"),
        ));
    }
    if let Some(name) = group_names(regex).find(|n| n.len() > MAX_LABEL_KEY_BYTES) {
        problems.push((
            "pattern",
            format!(
                "the capture group name {:?}... is longer than {MAX_LABEL_KEY_BYTES} bytes (it becomes a label key)",
                truncate_chars(name, 32)
            ),
        ));
    }
    let has_group = |name: &str| group_names(regex).any(|n| n == name);
    for part in subject.into_iter().flatten() {
        if let TemplatePart::Group(name) = part
            && !has_group(name)
        {
            problems.push((
                "subject",
                format!("names the group {name:?}, which the pattern does not capture"),
            ));
        }
    }
    let needs = |field: &'static str, group: &str, uses: bool, problems: &mut Vec<_>| {
        if uses && !has_group(group) {
            problems.push((
                field,
                format!("takes it from the {group:?} capture group, which the pattern lacks"),
            ));
        }
    };
    needs("status", "xid", status == Some(StatusSource::XidCatalog), problems);
    needs("action", "xid", action == Some(ActionSource::XidCatalog), problems);
    needs("status", "recovery", status == Some(StatusSource::RecoveryAction), problems);
    needs("action", "recovery", action == Some(ActionSource::RecoveryAction), problems);
}

/// A rule's pattern, matched against the line's bytes with ASCII classes (`\d`, `\w`, `\s`, `\b`
/// and case folding know ASCII only, as in node-problem-detector's Go patterns). Unicode classes
/// cost memory out of all proportion: the built-in rules' bounded repetitions (`\w{1,64}`,
/// `[^\s\[\]]{1,64}`) held ~11 MiB of compiled automata with them, more than the rest of the
/// agent; kernel-log lines are ASCII. A syntax error comes back as one line.
///
/// Built as the `regex` crate builds a `bytes::Regex` (leftmost-first, the same size limits),
/// less the one-pass DFA: it only speeds up the capture groups of a line that already matched,
/// which is rare, and it was half of the rules' compiled memory (~420 of ~820 KiB for the
/// built-in set).
fn build_regex(pattern: &str) -> Result<Regex, String> {
    let config = meta::Config::new()
        .onepass(false)
        .utf8_empty(false)
        .nfa_size_limit(Some(10 << 20))
        .hybrid_cache_capacity(2 << 20);
    Regex::builder()
        .configure(config)
        .syntax(syntax::Config::new().unicode(false).utf8(false))
        .build(pattern)
        .map_err(|err| {
            // A syntax error spans several lines with a caret; one line reads better.
            let text = err.syntax_error().map_or_else(|| err.to_string(), ToString::to_string);
            text.split_whitespace().collect::<Vec<_>>().join(" ")
        })
}

/// The names of `regex`'s capture groups.
fn group_names(regex: &Regex) -> impl Iterator<Item = &str> {
    regex.group_info().pattern_names(PatternID::ZERO).flatten()
}

/// A match's capture groups over the text it was found in.
struct Groups<'h> {
    caps: &'h Captures,
    haystack: &'h [u8],
}

impl<'h> Groups<'h> {
    /// Group `name`'s text; a match that cut a multi-byte character keeps a replacement
    /// character.
    fn get(&self, name: &str) -> Option<Cow<'h, str>> {
        let span = self.caps.get_group_by_name(name)?;
        Some(String::from_utf8_lossy(&self.haystack[span.range()]))
    }
}

/// Every problem with the user's rules, each naming `{section}.rules[i].field`.
pub fn validate(
    section: &str,
    user: &[KernelLogRule],
    problems: &mut crate::config::ConfigProblems,
) {
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, rule) in user.iter().enumerate() {
        if let Err(rule_problems) = compile(rule) {
            for (field, message) in rule_problems {
                problems.push(format!("{section}.rules[{i}].{field}"), message);
            }
        }
        if !rule.name.trim().is_empty()
            && let Some(first) = seen.insert(rule.name.as_str(), i)
        {
            problems.push(
                format!("{section}.rules[{i}].name"),
                format!("{:?} is already the name of rules[{first}]", rule.name),
            );
        }
    }
}

fn is_snake_case(id: &str) -> bool {
    id.starts_with(|c: char| c.is_ascii_lowercase())
        && id.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// Splits `${group}` references out of a subject template.
fn parse_template(template: &str) -> Result<Vec<TemplatePart>, String> {
    let mut parts = Vec::new();
    let mut rest = template;
    while let Some(start) = rest.find("${") {
        if start > 0 {
            parts.push(TemplatePart::Text(rest[..start].to_owned()));
        }
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err(format!("{template:?} has a \"${{\" without its \"}}\""));
        };
        let name = &after[..end];
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!(
                "{template:?} names the group {name:?}, which is not a group name"
            ));
        }
        parts.push(TemplatePart::Group(name.to_owned()));
        rest = &after[end + 1..];
    }
    if !rest.is_empty() {
        parts.push(TemplatePart::Text(rest.to_owned()));
    }
    Ok(parts)
}

/// `text` cut to at most `max` characters.
pub fn truncate_chars(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => text[..cut].to_owned(),
        None => text.to_owned(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn rule(pattern: &str) -> KernelLogRule {
        KernelLogRule {
            name: "r".into(),
            pattern: pattern.into(),
            finding: "f".into(),
            ..KernelLogRule::default()
        }
    }

    #[test]
    fn problems_name_their_fields() {
        let bad = KernelLogRule {
            name: String::new(),
            pattern: "(unclosed".into(),
            finding: "Bad Id".into(),
            status: "sometimes".into(),
            action: "pray".into(),
            subject: "${x".into(),
            clear_after: Duration::ZERO,
            lines: 9,
            clear_pattern: "(unclosed".into(),
        };
        let problems = compile(&bad).err().unwrap_or_default();
        let fields: Vec<&str> = problems.iter().map(|p| p.0).collect();
        for field in [
            "name",
            "pattern",
            "finding",
            "status",
            "action",
            "subject",
            "clear_after",
            "lines",
            "clear_pattern",
        ] {
            assert!(fields.contains(&field), "{field} missing from {problems:?}");
        }
        let missing_group =
            KernelLogRule { subject: "${dev}".into(), ..rule("disk (?P<disk>\\w+)") };
        let problems = compile(&missing_group).err().unwrap_or_default();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].0, "subject");
        assert!(problems[0].1.contains("dev"), "{problems:?}");
        let clear_lacks_group = KernelLogRule {
            subject: "${disk}".into(),
            clear_pattern: "disk back".into(),
            ..rule("disk (?P<disk>\\w+)")
        };
        let problems = compile(&clear_lacks_group).err().unwrap_or_default();
        assert_eq!(problems.iter().map(|p| p.0).collect::<Vec<_>>(), ["clear_pattern"]);
        assert!(problems[0].1.contains("disk"), "{problems:?}");
        let catalog = KernelLogRule { action: "xid-catalog".into(), ..rule("Xid") };
        let problems = compile(&catalog).err().unwrap_or_default();
        assert_eq!(problems.iter().map(|p| p.0).collect::<Vec<_>>(), ["action"]);
    }

    #[test]
    fn more_groups_than_a_finding_has_labels_is_refused() {
        let groups = |n: usize| (0..n).map(|i| format!("(?P<g{i}>\\d)")).collect::<String>();
        assert!(compile(&rule(&groups(MAX_GROUPS))).is_ok());
        let problems = compile(&rule(&groups(MAX_GROUPS + 1))).err().unwrap_or_default();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].0, "pattern");
        assert!(problems[0].1.contains(&format!("{} named capture groups", MAX_GROUPS + 1)));
        let long = format!("(?P<{}>x)", "k".repeat(MAX_LABEL_KEY_BYTES + 1));
        let problems = compile(&rule(&long)).err().unwrap_or_default();
        assert_eq!(problems.iter().map(|p| p.0).collect::<Vec<_>>(), ["pattern"]);
        assert!(problems[0].1.contains("longer than 128 bytes"), "{problems:?}");
    }

    #[test]
    fn templates_keep_text_and_groups() {
        let parts = parse_template("gpu-${pci}/x").unwrap();
        assert_eq!(
            parts,
            [
                TemplatePart::Text("gpu-".into()),
                TemplatePart::Group("pci".into()),
                TemplatePart::Text("/x".into())
            ]
        );
        assert!(parse_template("${}").is_err());
        assert_eq!(parse_template("").unwrap(), []);
    }

    #[test]
    fn user_rules_replace_builtins_by_name() {
        let user = KernelLogRule { name: "oom_kill".into(), status: "fail".into(), ..rule("x") };
        let rules = effective_rules(true, std::slice::from_ref(&user));
        assert_eq!(rules.len(), builtin_rules().len());
        assert_eq!(rules.iter().find(|r| r.name == "oom_kill"), Some(&user));
        assert_eq!(effective_rules(false, std::slice::from_ref(&user)), [user]);
    }

    #[test]
    fn truncation_respects_characters() {
        assert_eq!(truncate_chars("héllo", 2), "hé");
        assert_eq!(truncate_chars("hi", 5), "hi");
    }
}
