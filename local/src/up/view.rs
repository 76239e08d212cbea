//! What `fleetmend up` shows: on a terminal, a compact screen redrawn about once a second (the
//! nodes and their states, the job's step, loss and throughput, the latest events); otherwise
//! plain log lines, one per event or change, and a job progress line now and then.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::io::Write;
use std::time::{Duration, Instant};

use fleetmend_repairer::clock::unix_now_ms as now_ms;
use fleetmend_repairer::model::{Event, NodeState};
use fleetmend_repairer::queue::{JobState, JobView};

use super::fleet::{Fleet, NodeView};
use super::supervisor::{AgentState, Role};

/// Events shown on the terminal screen.
const EVENTS_SHOWN: usize = 8;
/// Plain output: a job progress line at least this often while it runs.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// Events read from the store per update.
const EVENTS_PER_READ: usize = 500;

/// One line of the event list: when (ms since the epoch) and what.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Line {
    at_ms: u64,
    text: String,
}

/// The view's memory between updates.
#[derive(Debug)]
pub struct View {
    tty: bool,
    started_ms: u64,
    last_event: i64,
    last_note: u64,
    recent: VecDeque<Line>,
    job_state: Option<(JobState, u32)>,
    last_progress: Option<Instant>,
    /// The Slurm job's last line (state, restarts, nodes) in the plain log.
    slurm_line: Option<String>,
    node_states: BTreeMap<String, (Option<NodeState>, Role, AgentState)>,
    width: usize,
}

/// ANSI: bold, colours, reset, clear to the end of the line.
const BOLD: &str = "\x1b[1m";
const DIM: &str = "\x1b[2m";
const RED: &str = "\x1b[31m";
const GREEN: &str = "\x1b[32m";
const YELLOW: &str = "\x1b[33m";
const CYAN: &str = "\x1b[36m";
const RESET: &str = "\x1b[0m";
const CLEAR_EOL: &str = "\x1b[K";

impl View {
    /// `tty`: stdout is a terminal (redrawn screen) or not (log lines).
    /// Times are shown from `started_ms` on.
    pub fn new(tty: bool, started_ms: u64) -> View {
        let width = std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.parse::<usize>().ok())
            .filter(|w| *w >= 60)
            .unwrap_or(120);
        View {
            tty,
            started_ms,
            last_event: 0,
            last_note: 0,
            recent: VecDeque::new(),
            job_state: None,
            last_progress: None,
            slurm_line: None,
            node_states: BTreeMap::new(),
            width,
        }
    }

    /// What is printed once at start: where the repairer's API, its admin token and every agent's
    /// `/metrics` are.
    pub fn banner(fleet: &Fleet) -> String {
        let mut text = String::new();
        let _ = writeln!(text, "fleetmend up: state directory {}", fleet.state_dir().display());
        let _ = writeln!(text, "repairer API: {}", fleet.repairer_url());
        let _ = writeln!(text, "admin token: {}", fleet.admin_token_file().display());
        for node in fleet.nodes() {
            if node.info.role == Role::Retired {
                continue;
            }
            let _ = writeln!(
                text,
                "agent {} ({}): {}",
                node.info.name,
                node.info.role.as_str(),
                node.info.metrics_url
            );
        }
        if let Some(job) = fleet.job() {
            let _ = writeln!(
                text,
                "job {}: {} rank(s) of `{}`",
                job.job.id,
                job.job.spec.nodes,
                job.job.spec.argv.iter().skip(1).cloned().collect::<Vec<_>>().join(" ")
            );
        }
        if let Some(conf) = fleet.slurm_conf() {
            let _ = writeln!(text, "Slurm: SLURM_CONF={}", conf.display());
            if let Some(names) = fleet.slurm_node_names() {
                let pairs: Vec<String> = names.iter().map(|(f, s)| format!("{f}={s}")).collect();
                let _ = writeln!(text, "Slurm nodes: {}", pairs.join(" "));
            }
        }
        if let (Some(id), Some(output)) = (fleet.job_id(), fleet.slurm_job_output()) {
            let _ = writeln!(
                text,
                "job {id}: sbatch of resumable.sbatch on {} node(s), output {}",
                fleet.config().nodes,
                output.display()
            );
        }
        let _ = writeln!(
            text,
            "try: FLEETMEND_REPAIRER={} FLEETMEND_TOKEN_FILE={} fleetmend nodes",
            fleet.repairer_url(),
            fleet.admin_token_file().display()
        );
        text
    }

    fn elapsed(&self, at_ms: u64) -> String {
        let ms = at_ms.saturating_sub(self.started_ms);
        format!("+{}.{}s", ms / 1000, (ms % 1000) / 100)
    }

    fn event_text(event: &Event) -> String {
        let mut text = String::new();
        if let Some(node) = &event.node {
            let _ = write!(text, "{node} ");
        }
        text.push_str(event.kind.as_str());
        if let (Some(from), Some(to)) = (event.from_state, event.to_state) {
            let _ = write!(text, " {from} -> {to}");
        }
        if !event.reason.is_empty() {
            let _ = write!(text, ": {}", event.reason);
        }
        text
    }

    /// The new events and notes since the last call, oldest first.
    fn take_new(&mut self, fleet: &Fleet) -> Vec<Line> {
        let mut lines = Vec::new();
        match fleet.events(self.last_event, EVENTS_PER_READ) {
            Ok(events) => {
                for event in events {
                    self.last_event = event.id;
                    lines.push(Line { at_ms: event.at_ms, text: Self::event_text(&event) });
                }
            }
            Err(err) => tracing::warn!(error = %err, "reading the event log failed"),
        }
        for note in fleet.notes(self.last_note) {
            self.last_note = note.seq;
            lines.push(Line { at_ms: note.at_ms, text: format!("{} {}", note.node, note.what) });
        }
        lines.sort_by_key(|l| l.at_ms);
        lines
    }

    /// Brings the view up to date: a redrawn screen, or the new log lines.
    pub fn update(&mut self, fleet: &Fleet, out: &mut impl Write) -> std::io::Result<()> {
        let lines = self.take_new(fleet);
        let nodes = fleet.nodes();
        let job = fleet.job();
        if self.tty {
            for line in lines {
                self.recent.push_back(line);
            }
            while self.recent.len() > EVENTS_SHOWN {
                self.recent.pop_front();
            }
            let screen = self.screen(fleet, &nodes, job.as_ref());
            out.write_all(screen.as_bytes())?;
        } else {
            let mut text = String::new();
            for line in &lines {
                let _ = writeln!(text, "[{}] {}", self.elapsed(line.at_ms), line.text);
            }
            self.node_changes(&nodes, &mut text);
            self.job_changes(job.as_ref(), &mut text);
            self.slurm_job_changes(fleet, &mut text);
            out.write_all(text.as_bytes())?;
        }
        out.flush()
    }

    /// Plain output: a line when a node's role or agent changes (its repairer state changes come
    /// as events).
    fn node_changes(&mut self, nodes: &[NodeView], text: &mut String) {
        for node in nodes {
            let now = (node.state, node.info.role, node.info.agent);
            let before = self.node_states.insert(node.info.name.clone(), now);
            if let Some((_, role, agent)) = before
                && (role != now.1 || agent != now.2)
            {
                let _ = writeln!(
                    text,
                    "[{}] {} is now {} (agent {})",
                    self.elapsed(now_ms()),
                    node.info.name,
                    now.1.as_str(),
                    now.2.as_str()
                );
            }
        }
    }

    /// Plain output: a line when the Slurm job's state, restarts or nodes change, and its
    /// progress now and then.
    fn slurm_job_changes(&mut self, fleet: &Fleet, text: &mut String) {
        let Some(line) = slurm_job_line(fleet) else { return };
        let changed = self.slurm_line.as_deref() != Some(line.0.as_str());
        let due = self.last_progress.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY);
        if changed || due {
            let _ = writeln!(text, "[{}] {}{}", self.elapsed(now_ms()), line.0, line.1);
            self.slurm_line = Some(line.0);
            self.last_progress = Some(Instant::now());
        }
    }

    fn job_changes(&mut self, job: Option<&JobView>, text: &mut String) {
        let Some(job) = job else { return };
        let key = (job.job.state, job.job.attempt);
        let changed = self.job_state != Some(key);
        let due = self.last_progress.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY);
        if changed || (due && job.job.state == JobState::Running) {
            let _ = writeln!(text, "[{}] {}", self.elapsed(now_ms()), job_line(job));
            self.job_state = Some(key);
            self.last_progress = Some(Instant::now());
        }
    }

    fn screen(&self, fleet: &Fleet, nodes: &[NodeView], job: Option<&JobView>) -> String {
        let mut s = String::new();
        // Home, then every line cleared to its end; what is below the last line is cleared too.
        s.push_str("\x1b[H");
        let up = now_ms().saturating_sub(self.started_ms) / 1000;
        let _ = writeln!(
            s,
            "{BOLD}fleetmend up{RESET}  repairer {CYAN}{}{RESET}  admin token {}  up {}m{:02}s{CLEAR_EOL}",
            fleet.repairer_url(),
            fleet.admin_token_file().display(),
            up / 60,
            up % 60
        );
        let _ = writeln!(s, "{CLEAR_EOL}");
        let _ = writeln!(
            s,
            "{BOLD}{:<10} {:<8} {:<12} {:<8} {:>4}  {:<10} METRICS{RESET}{CLEAR_EOL}",
            "NODE", "ROLE", "STATE", "AGENT", "FAIL", "BOOT"
        );
        for node in nodes {
            let state = node.state.map_or("-", NodeState::as_str);
            let colour = match node.state {
                Some(NodeState::Healthy) => GREEN,
                Some(NodeState::Unreachable | NodeState::Quarantined) => RED,
                Some(NodeState::Retired) | None => DIM,
                Some(_) => YELLOW,
            };
            let agent_colour = match node.info.agent {
                AgentState::Running => "",
                AgentState::Dead => RED,
                _ => YELLOW,
            };
            let boot: String = node.boot_id.as_deref().unwrap_or("-").chars().take(8).collect();
            let _ = writeln!(
                s,
                "{:<10} {:<8} {colour}{:<12}{RESET} {agent_colour}{:<8}{RESET} {:>4}  {:<10} {}{CLEAR_EOL}",
                node.info.name,
                node.info.role.as_str(),
                state,
                node.info.agent.as_str(),
                node.failing,
                boot,
                node.info.metrics_url
            );
        }
        let _ = writeln!(s, "{CLEAR_EOL}");
        match job {
            Some(job) => {
                let _ = writeln!(s, "{BOLD}{}{RESET}{CLEAR_EOL}", job_line(job));
                let _ = writeln!(
                    s,
                    "    nodes {}  {}{CLEAR_EOL}",
                    if job.job.nodes.is_empty() { "-".to_owned() } else { job.job.nodes.join(",") },
                    truncate(&job.job.reason, self.width.saturating_sub(30))
                );
            }
            None => match slurm_job_line(fleet) {
                Some((line, progress)) => {
                    let _ = writeln!(s, "{BOLD}{line}{RESET}{progress}{CLEAR_EOL}");
                }
                None => {
                    let _ = writeln!(s, "{BOLD}no job{RESET}{CLEAR_EOL}");
                }
            },
        }
        let _ = writeln!(s, "{CLEAR_EOL}");
        let _ = writeln!(s, "{BOLD}EVENTS{RESET}{CLEAR_EOL}");
        for line in &self.recent {
            let text = format!("{:>8} {}", self.elapsed(line.at_ms), line.text);
            let _ = writeln!(s, "{}{CLEAR_EOL}", truncate(&text, self.width));
        }
        let _ = writeln!(s, "{CLEAR_EOL}");
        let _ = write!(s, "{DIM}Ctrl-C stops everything.{RESET}{CLEAR_EOL}\x1b[J");
        s
    }
}

/// The Slurm job in one line: its state, restarts and nodes as Slurm shows them; and its newest
/// progress from its output.
fn slurm_job_line(fleet: &Fleet) -> Option<(String, String)> {
    let status = fleet.slurm_job()?;
    let mut line =
        format!("Slurm job {} {}: restarts {}", status.id, status.state, status.restarts);
    if !status.nodes.is_empty() {
        let _ = write!(line, ", nodes {}", status.nodes);
    }
    if !status.reason.is_empty() {
        let _ = write!(line, " ({})", status.reason);
    }
    let progress = match fleet.slurm_job_progress() {
        Some((step, loss)) => format!(", step {step}/{}, loss {loss:.4}", fleet.config().steps),
        None => String::new(),
    };
    Some((line, progress))
}

/// The job in one line: state, attempt, step, loss, throughput, goodput.
pub fn job_line(job: &JobView) -> String {
    let j = &job.job;
    let mut text = format!(
        "job {} {}: attempt {}, restarts {}/{}",
        j.id, j.state, j.attempt, j.restarts, j.spec.max_restarts
    );
    // `--steps N` or `--steps=N`: the bundled trainer's, or a job's own command's.
    let argv = &j.spec.argv;
    let total: Option<&str> = argv
        .iter()
        .position(|a| a == "--steps")
        .and_then(|i| argv.get(i + 1))
        .map(String::as_str)
        .or_else(|| argv.iter().find_map(|a| a.strip_prefix("--steps=")));
    match (job.step, total) {
        (Some(step), Some(total)) => {
            let _ = write!(text, ", step {step}/{total}");
        }
        (Some(step), None) => {
            let _ = write!(text, ", step {step}");
        }
        _ => {}
    }
    if let Some(loss) = job.loss {
        let _ = write!(text, ", loss {loss:.4}");
    }
    if let Some(rate) = j.measured.steps_per_second {
        let _ = write!(text, ", {rate:.1} steps/s");
    }
    let samples: f64 =
        j.ranks.iter().filter_map(|r| r.progress.as_ref()).map(|p| p.samples_per_second).sum();
    if samples > 0.0 && j.state == JobState::Running {
        let _ = write!(text, ", {samples:.0} samples/s");
    }
    let _ = write!(text, ", goodput {:.0}%", job.goodput_ratio * 100.0);
    text
}

/// At most `width` characters of `text`.
fn truncate(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_are_cut_to_the_width() {
        assert_eq!(truncate("abcdef", 10), "abcdef");
        assert_eq!(truncate("abcdef", 4), "abc…");
    }
}
