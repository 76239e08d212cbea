//! Xid bursts: a non-fatal Xid that keeps coming back on the same GPU — and, where the line names
//! it, the same GPC and TPC — is a hardware fault, not an application's.
//!
//! NVIDIA's Xid catalog says of Xid 13 (graphics engine exception) that it is usually the
//! application's, but "if the same GPC/TPC shows up repeatedly" the GPU should be tested; Xid 31
//! (MMU fault) likewise, on the same GPU. One incident prints several lines within a second (one
//! per SM or exception kind), so occurrences closer than [`INCIDENT_GAP`] are one incident.
//!
//! For Xid 13 only the lines that name a GPC and TPC count: an application that crashes on every
//! restart repeats Xid 13 on the same GPU too (its `Graphics Exception: ESR` lines name no place),
//! and counting those reboots healthy nodes (the noise soak of `fleetmend simulate --noise` did).

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, SystemTime};

use fleetmend_proto::{Finding, RecommendedAction, Status};
use serde::Deserialize;

use super::rules::{RuleMatch, truncate_chars};
use super::{MAX_MESSAGE_CHARS, MAX_SUBJECTS, NAME, age};
use crate::config::ConfigProblems;

/// Lines closer together than this are one incident.
pub const INCIDENT_GAP: Duration = Duration::from_secs(1);

/// The finding a burst raises.
pub const FINDING: &str = "xid_burst";

/// When repeats of one Xid code escalate (`[checks.kernel_log.xid_bursts.13]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct XidBurstRule {
    /// Incidents within `window` on the same GPU (and GPC/TPC where the line names them) that
    /// make a burst.
    pub count: u32,
    /// The window; also how long the finding stays after the burst.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// `warn` or `fail`.
    pub status: Status,
    /// What the burst asks for.
    pub action: RecommendedAction,
    /// Count only lines that name the GPC and TPC; default: yes for Xid 13 (NVIDIA's sign of a
    /// fault is the same GPC/TPC again), no for other codes.
    pub same_place: Option<bool>,
}

impl Default for XidBurstRule {
    fn default() -> Self {
        XidBurstRule {
            count: 5,
            window: Duration::from_secs(3600),
            status: Status::Fail,
            // A reboot resets the GPU, and the validation's deep check tests it before it takes
            // work again; a GPU that keeps failing it goes on up the ladder.
            action: RecommendedAction::Reboot,
            same_place: None,
        }
    }
}

impl XidBurstRule {
    /// Whether only lines naming the GPC and TPC count toward a burst of `code`.
    fn needs_place(&self, code: u32) -> bool {
        self.same_place.unwrap_or(code == 13)
    }
}

/// The built-in bursts: Xid 13 and 31, 5 incidents within an hour → fail, reboot.
pub fn default_bursts() -> BTreeMap<String, XidBurstRule> {
    ["13", "31"].into_iter().map(|code| (code.to_owned(), XidBurstRule::default())).collect()
}

/// Every problem with the configured bursts, each naming `{section}.xid_bursts.CODE.field`.
pub fn validate(
    section: &str,
    bursts: &BTreeMap<String, XidBurstRule>,
    problems: &mut ConfigProblems,
) {
    for (code, rule) in bursts {
        let field = format!("{section}.xid_bursts.{code}");
        if code.parse::<u32>().is_err() {
            problems.push(field.clone(), format!("{code:?} is not an Xid code"));
        }
        if rule.count < 2 {
            problems.push(format!("{field}.count"), "must be at least 2");
        }
        if rule.window.is_zero() {
            problems.push(format!("{field}.window"), "must be greater than zero");
        }
        if !matches!(rule.status, Status::Warn | Status::Fail) {
            problems.push(format!("{field}.status"), "must be warn or fail");
        }
    }
}

/// One GPU (and GPC/TPC) and Xid code.
type Key = (String, u32, String);

#[derive(Debug, Default)]
struct Track {
    /// Start of each incident within the window, oldest first (at most `count`).
    incidents: VecDeque<SystemTime>,
    last: Option<SystemTime>,
    /// When the burst was reached, the incidents then and the latest line.
    fired: Option<(SystemTime, usize, String)>,
    labels: BTreeMap<String, String>,
}

/// Counts incidents per GPU and code, and raises [`FINDING`] on a burst.
#[derive(Debug)]
pub struct XidBursts {
    rules: BTreeMap<u32, XidBurstRule>,
    tracks: BTreeMap<Key, Track>,
}

impl XidBursts {
    pub fn new(config: &BTreeMap<String, XidBurstRule>) -> Self {
        let rules = config
            .iter()
            .filter_map(|(code, rule)| Some((code.parse().ok()?, rule.clone())))
            .collect();
        XidBursts { rules, tracks: BTreeMap::new() }
    }

    /// Takes in a rule's match (only Xid lines, with `xid` and `pci` labels, count).
    pub fn observe(&mut self, found: &RuleMatch, at: SystemTime, line: &str) {
        let (Some(code), Some(pci)) = (found.labels.get("xid"), found.labels.get("pci")) else {
            return;
        };
        let Ok(code) = code.parse::<u32>() else { return };
        let Some(rule) = self.rules.get(&code) else { return };
        let place: Vec<String> = ["gpc", "tpc"]
            .iter()
            .filter_map(|unit| {
                found.labels.get(*unit).map(|v| format!("{} {v}", unit.to_uppercase()))
            })
            .collect();
        if place.is_empty() && rule.needs_place(code) {
            return;
        }
        let key = (pci.clone(), code, place.join(", "));
        if !self.tracks.contains_key(&key) && self.tracks.len() >= MAX_SUBJECTS {
            let stale = self.tracks.iter().min_by_key(|(_, t)| t.last).map(|(k, _)| k.clone());
            if let Some(stale) = stale {
                self.tracks.remove(&stale);
            }
        }
        let track = self.tracks.entry(key.clone()).or_default();
        let same_incident =
            track.last.is_some_and(|last| age(at, last) < INCIDENT_GAP && at >= last);
        track.last = Some(track.last.map_or(at, |last| last.max(at)));
        if same_incident {
            return;
        }
        track.incidents.push_back(at);
        while track.incidents.front().is_some_and(|first| age(at, *first) > rule.window) {
            track.incidents.pop_front();
        }
        while track.incidents.len() > rule.count as usize {
            track.incidents.pop_front();
        }
        if track.incidents.len() >= rule.count as usize {
            let mut labels = found.labels.clone();
            labels.insert("count".to_owned(), track.incidents.len().to_string());
            track.labels = labels;
            track.fired = Some((at, track.incidents.len(), line.to_owned()));
        }
    }

    /// The findings at `now`: a burst fails for `window` after it was reached, then clears.
    pub fn findings(&mut self, now: SystemTime, out: &mut Vec<Finding>) {
        let rules = &self.rules;
        self.tracks.retain(|(_, code, _), track| {
            rules.get(code).is_some_and(|rule| {
                track.last.is_some_and(|last| age(now, last) <= rule.window.saturating_mul(2))
            })
        });
        for ((pci, code, place), track) in &self.tracks {
            let (Some(rule), Some((at, incidents, line))) = (self.rules.get(code), &track.fired)
            else {
                continue;
            };
            let window = humantime::format_duration(rule.window);
            let finding = if age(now, *at) <= rule.window {
                let place = if place.is_empty() { String::new() } else { format!(" on {place}") };
                let mut finding = Finding::new(
                    NAME,
                    FINDING,
                    pci.clone(),
                    rule.status,
                    rule.action,
                    truncate_chars(
                        &format!(
                            "Xid {code} repeated {incidents} times within {window}{place}: {line}"
                        ),
                        MAX_MESSAGE_CHARS,
                    ),
                )
                .with_value(*incidents as f64);
                finding.labels = track.labels.clone();
                finding
            } else {
                Finding::new(
                    NAME,
                    FINDING,
                    pci.clone(),
                    Status::Ok,
                    RecommendedAction::None,
                    format!("cleared: no Xid {code} burst in the last {window}"),
                )
                .with_label("xid", code.to_string())
            };
            out.push(finding.with_label("rule", FINDING));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn xid13(gpc: &str, tpc: &str) -> RuleMatch {
        let labels = [("xid", "13"), ("pci", "0000:3b:00"), ("gpc", gpc), ("tpc", tpc)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        RuleMatch {
            subject: "0000:3b:00".into(),
            status: Status::Warn,
            action: RecommendedAction::RestartApp,
            labels,
        }
    }

    #[test]
    fn repeats_on_the_same_tpc_escalate_and_clear_after_the_window() {
        let mut bursts = XidBursts::new(&default_bursts());
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let minute = Duration::from_secs(60);
        let mut out = Vec::new();
        for i in 0..4 {
            bursts.observe(&xid13("1", "2"), t0 + minute * i, "line");
            // Lines of the same incident and other TPCs do not add up.
            bursts.observe(&xid13("1", "2"), t0 + minute * i + Duration::from_millis(200), "line");
            bursts.observe(&xid13("0", i.to_string().as_str()), t0 + minute * i, "line");
        }
        bursts.findings(t0 + minute * 4, &mut out);
        assert!(out.is_empty(), "{out:?}");
        bursts.observe(&xid13("1", "2"), t0 + minute * 4, "the fifth");
        bursts.findings(t0 + minute * 5, &mut out);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!((out[0].status, out[0].action), (Status::Fail, RecommendedAction::Reboot));
        assert_eq!(out[0].labels["count"], "5");
        assert!(out[0].message.contains("on GPC 1, TPC 2: the fifth"), "{}", out[0].message);
        out.clear();
        bursts.findings(t0 + minute * 66, &mut out);
        assert_eq!(out[0].status, Status::Ok, "{out:?}");
    }

    /// Found by the kernel_log fuzz target's cap on finding messages
    /// (fuzz/regressions/kernel_log/): a burst's message carried its whole line, up to 8 KiB.
    #[test]
    fn a_burst_message_is_cut_like_any_finding_message() {
        let mut bursts = XidBursts::new(&default_bursts());
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let line = "x".repeat(8192);
        for i in 0..5 {
            bursts.observe(&xid13("1", "2"), t0 + Duration::from_secs(60) * i, &line);
        }
        let mut out = Vec::new();
        bursts.findings(t0 + Duration::from_secs(300), &mut out);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].message.chars().count(), MAX_MESSAGE_CHARS);
    }

    /// A window as long as a config can say (humantime parses up to `u64::MAX` seconds) does not
    /// overflow when the findings are made.
    #[test]
    fn the_longest_window_does_not_overflow() {
        let rule =
            XidBurstRule { window: Duration::from_secs(u64::MAX), ..XidBurstRule::default() };
        let mut bursts = XidBursts::new(&[("13".to_owned(), rule)].into_iter().collect());
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        bursts.observe(&xid13("1", "2"), t0, "line");
        let mut out = Vec::new();
        bursts.findings(t0 + Duration::from_secs(60), &mut out);
        assert!(out.is_empty(), "{out:?}");
    }

    /// An application that crashes on every restart: Xid 13 on one GPU five times within the
    /// hour, its lines naming no GPC/TPC, is no burst; Xid 31 on one GPU five times is (NVIDIA's
    /// catalog names the GPU for it), unless its rule asks for the same place.
    #[test]
    fn placeless_xid_13_lines_make_no_burst_but_xid_31_on_one_gpu_does() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let at = |i: u32| t0 + Duration::from_secs(600) * i;
        let placeless = |code: &str| RuleMatch {
            labels: [("xid", code), ("pci", "0000:3b:00")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            ..xid13("1", "2")
        };
        let mut bursts = XidBursts::new(&default_bursts());
        for i in 0..5 {
            bursts.observe(&placeless("13"), at(i), "Graphics Exception: ESR 0x51de30=0x1000e");
        }
        let mut out = Vec::new();
        bursts.findings(at(5), &mut out);
        assert!(out.is_empty(), "{out:?}");
        for i in 0..5 {
            bursts.observe(&placeless("31"), at(i), "MMU Fault");
        }
        bursts.findings(at(5), &mut out);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!((out[0].status, &out[0].labels["xid"]), (Status::Fail, &"31".to_owned()));
        let own = XidBurstRule { same_place: Some(true), ..XidBurstRule::default() };
        let mut bursts = XidBursts::new(&[("31".to_owned(), own)].into_iter().collect());
        for i in 0..5 {
            bursts.observe(&placeless("31"), at(i), "MMU Fault");
        }
        out.clear();
        bursts.findings(at(5), &mut out);
        assert!(out.is_empty(), "{out:?}");
    }

    #[test]
    fn spread_out_repeats_are_no_burst() {
        let mut bursts = XidBursts::new(&default_bursts());
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        for i in 0..10 {
            bursts.observe(&xid13("1", "2"), t0 + Duration::from_secs(3600) * i, "line");
        }
        let mut out = Vec::new();
        bursts.findings(t0 + Duration::from_secs(36_000), &mut out);
        assert!(out.iter().all(|f| f.status == Status::Ok), "{out:?}");
    }
}
