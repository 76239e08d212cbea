//! Placement: which waiting jobs start now, on which nodes, with which rendezvous port. A pure
//! function of the waiting jobs and the nodes, covered by table tests.
//!
//! Strict priority, then FIFO: the job at the head of the queue waits until N eligible nodes are
//! free (gang allocation, one rank per node) and nothing behind it starts meanwhile — no
//! backfill, so a large job is never starved by a stream of small ones.
//!
//! Hot spares: a job at the head of the queue that the free nodes cannot fit takes the hot spares
//! it lacks (healthy nodes held out of work with fleetmend's spare drain), at once, rather than
//! wait for its lost node's repair.

use std::collections::BTreeSet;
use std::ops::RangeInclusive;

use crate::model::NodeState;

/// A job waiting for nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting<'a> {
    pub id: &'a str,
    pub nodes: u32,
    pub priority: i32,
    /// Requeued after a restart: goes to the front of its priority.
    pub requeued: bool,
    pub seq: u64,
    /// The port of its previous attempt (not handed out again at once: the old rank 0 may still
    /// hold it on a node that stopped answering).
    pub previous_port: Option<u16>,
    /// Still stopping, to be requeued at the front when its ranks are gone: it cannot start yet,
    /// but it keeps its place, so a job behind it does not take the nodes it is about to need.
    pub stopping: bool,
}

/// A node as placement sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate<'a> {
    pub name: &'a str,
    pub state: NodeState,
    /// When the repairer last received its report.
    pub last_report_ms: u64,
    /// The host other nodes reach it at (from its reports).
    pub address: Option<&'a str>,
    /// Drained in the queue (by fleetmend or an admin).
    pub drained: bool,
    /// The drain holds it as a hot spare (`scheduler::SPARE_REASON`).
    pub spare: bool,
    /// Runs (or is about to run) a rank of a job.
    pub busy: bool,
}

impl Candidate<'_> {
    /// May take a rank now.
    pub fn eligible(&self, now: u64, unreachable_window_ms: u64) -> bool {
        !self.drained && self.ready(now, unreachable_window_ms)
    }

    /// A hot spare that may be put to work now.
    pub fn ready_spare(&self, now: u64, unreachable_window_ms: u64) -> bool {
        self.drained && self.spare && self.ready(now, unreachable_window_ms)
    }

    fn ready(&self, now: u64, unreachable_window_ms: u64) -> bool {
        self.state == NodeState::Healthy
            && !self.busy
            && now.saturating_sub(self.last_report_ms) <= unreachable_window_ms
    }
}

/// One job to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub job: String,
    /// Rank i on `nodes[i]`.
    pub nodes: Vec<String>,
    pub master_addr: String,
    pub master_port: u16,
    /// The hot spares among `nodes`: their spare drain is lifted before the job launches.
    pub spares: Vec<String>,
}

/// The job at the head of the queue that cannot start yet, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    pub job: String,
    pub why: String,
}

/// The order jobs are considered in: priority (higher first), requeued before new, then FIFO.
pub fn queue_order(jobs: &mut [Waiting<'_>]) {
    jobs.sort_by(|a, b| {
        b.priority
            .cmp(&a.priority)
            .then((b.requeued || b.stopping).cmp(&(a.requeued || a.stopping)))
            .then(a.seq.cmp(&b.seq))
    });
}

/// The jobs that start now, from the head of the queue, until one does not fit.
pub fn place(
    jobs: &[Waiting<'_>],
    nodes: &[Candidate<'_>],
    ports_in_use: &BTreeSet<u16>,
    ports: RangeInclusive<u16>,
    now: u64,
    unreachable_window_ms: u64,
) -> (Vec<Placement>, Option<Blocked>) {
    let (placed, blocked) =
        place_indexed(jobs, nodes, ports_in_use, ports, now, unreachable_window_ms);
    let names = |chosen: &[usize]| chosen.iter().map(|i| nodes[*i].name.to_owned()).collect();
    let placements = placed
        .into_iter()
        .map(|p| {
            let first = &nodes[p.nodes[0]];
            Placement {
                master_addr: first.address.unwrap_or(first.name).to_owned(),
                nodes: names(&p.nodes),
                spares: names(&p.spares),
                master_port: p.master_port,
                job: p.job,
            }
        })
        .collect();
    (placements, blocked)
}

/// A [`Placement`] by the nodes' places in the candidates given: for a caller that keeps its
/// nodes by number (the fleet simulator places 2,000-rank jobs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub job: String,
    /// Rank i on the candidate `nodes[i]`.
    pub nodes: Vec<usize>,
    pub master_port: u16,
    /// The hot spares among `nodes`.
    pub spares: Vec<usize>,
}

/// [`place`], the nodes named by their index in `nodes`.
pub fn place_indexed(
    jobs: &[Waiting<'_>],
    nodes: &[Candidate<'_>],
    ports_in_use: &BTreeSet<u16>,
    ports: RangeInclusive<u16>,
    now: u64,
    unreachable_window_ms: u64,
) -> (Vec<Placed>, Option<Blocked>) {
    let mut order: Vec<Waiting<'_>> = jobs.to_vec();
    queue_order(&mut order);
    let sorted = |keep: &dyn Fn(&Candidate<'_>) -> bool| {
        let mut list: Vec<usize> = (0..nodes.len()).filter(|i| keep(&nodes[*i])).collect();
        list.sort_by(|a, b| nodes[*a].name.cmp(nodes[*b].name));
        list
    };
    let mut free = sorted(&|n| n.eligible(now, unreachable_window_ms));
    let mut spares = sorted(&|n| n.ready_spare(now, unreachable_window_ms));
    let mut used_ports = ports_in_use.clone();
    let mut placements = Vec::new();
    for job in order {
        if job.stopping {
            return (placements, None);
        }
        let wanted = job.nodes as usize;
        if wanted > free.len() + spares.len() {
            let spare_words = match spares.len() {
                0 => String::new(),
                n => format!(" and {n} hot spare(s)"),
            };
            let why =
                format!("waits for {wanted} eligible node(s): {} free{spare_words}", free.len());
            return (placements, Some(Blocked { job: job.id.to_owned(), why }));
        }
        let Some(port) =
            ports.clone().find(|p| !used_ports.contains(p) && Some(*p) != job.previous_port)
        else {
            let why = "waits for a free MASTER_PORT".to_owned();
            return (placements, Some(Blocked { job: job.id.to_owned(), why }));
        };
        let from_free = wanted.min(free.len());
        let mut chosen: Vec<usize> = free.drain(..from_free).collect();
        let taken: Vec<usize> = spares.drain(..wanted - from_free).collect();
        chosen.extend(&taken);
        used_ports.insert(port);
        placements.push(Placed {
            job: job.id.to_owned(),
            nodes: chosen,
            master_port: port,
            spares: taken,
        });
    }
    (placements, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 100_000;
    const WINDOW: u64 = 30_000;

    fn node(name: &str) -> Candidate<'_> {
        Candidate {
            name,
            state: NodeState::Healthy,
            last_report_ms: NOW,
            address: None,
            drained: false,
            spare: false,
            busy: false,
        }
    }

    fn job(id: &str, nodes: u32, priority: i32, seq: u64) -> Waiting<'_> {
        Waiting { id, nodes, priority, requeued: false, seq, previous_port: None, stopping: false }
    }

    fn run(jobs: &[Waiting<'_>], nodes: &[Candidate<'_>]) -> Vec<(String, Vec<String>, u16)> {
        place(jobs, nodes, &BTreeSet::from([29500]), 29500..=29503, NOW, WINDOW)
            .0
            .into_iter()
            .map(|p| (p.job, p.nodes, p.master_port))
            .collect()
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    /// Name, waiting jobs, nodes, expected (job, nodes, port) placements.
    type Case<'a> =
        (&'a str, Vec<Waiting<'a>>, Vec<Candidate<'a>>, Vec<(String, Vec<String>, u16)>);

    #[test]
    fn placement_table() {
        let four = [node("n1"), node("n2"), node("n3"), node("n4")];
        let mut sick = four.clone();
        sick[0].state = NodeState::Suspect;
        sick[1].drained = true;
        let mut silent = four.clone();
        silent[2].last_report_ms = NOW - WINDOW - 1;
        let mut busy = four.clone();
        busy[3].busy = true;
        let cases: Vec<Case<'_>> = vec![
            (
                "higher priority first, FIFO after, ports skip the one in use",
                vec![job("low", 2, 0, 1), job("high", 2, 5, 2)],
                four.to_vec(),
                vec![
                    ("high".into(), names(&["n1", "n2"]), 29501),
                    ("low".into(), names(&["n3", "n4"]), 29502),
                ],
            ),
            (
                "FIFO within a priority",
                vec![job("b", 1, 0, 2), job("a", 1, 0, 1)],
                four.to_vec(),
                vec![("a".into(), names(&["n1"]), 29501), ("b".into(), names(&["n2"]), 29502)],
            ),
            (
                "no backfill past a head that does not fit",
                vec![job("big", 4, 9, 1), job("small", 1, 0, 2)],
                busy.to_vec(),
                vec![],
            ),
            (
                "the head waits for unhealthy, drained and silent nodes' replacements",
                vec![job("a", 3, 0, 1)],
                sick.to_vec(),
                vec![],
            ),
            (
                "a silent node is not eligible",
                vec![job("a", 3, 0, 1), job("b", 1, 0, 2)],
                silent.to_vec(),
                vec![("a".into(), names(&["n1", "n2", "n4"]), 29501)],
            ),
            (
                "requeued goes to the front of its priority, not past a higher one",
                vec![
                    job("new", 1, 1, 1),
                    Waiting { requeued: true, ..job("again", 1, 1, 7) },
                    job("top", 1, 2, 9),
                ],
                four.to_vec(),
                vec![
                    ("top".into(), names(&["n1"]), 29501),
                    ("again".into(), names(&["n2"]), 29502),
                    ("new".into(), names(&["n3"]), 29503),
                ],
            ),
            (
                "out of ports: the rest waits",
                vec![job("a", 1, 0, 1), job("b", 1, 0, 2), job("c", 1, 0, 3), job("d", 1, 0, 4)],
                four.to_vec(),
                vec![
                    ("a".into(), names(&["n1"]), 29501),
                    ("b".into(), names(&["n2"]), 29502),
                    ("c".into(), names(&["n3"]), 29503),
                ],
            ),
            (
                "a requeued job does not get its previous port back at once",
                vec![Waiting { previous_port: Some(29501), requeued: true, ..job("a", 1, 0, 1) }],
                four.to_vec(),
                vec![("a".into(), names(&["n1"]), 29502)],
            ),
        ];
        for (name, jobs, nodes, expected) in cases {
            assert_eq!(run(&jobs, &nodes), expected, "{name}");
        }
    }

    #[test]
    fn a_job_short_of_free_nodes_takes_the_hot_spares_it_lacks_and_no_more() {
        let spare = |name| Candidate { drained: true, spare: true, ..node(name) };
        let mut nodes = vec![node("n1"), node("n2"), node("n3"), spare("s1"), spare("s2")];
        let all = &BTreeSet::new();
        let (placed, why) = place(&[job("a", 4, 0, 1)], &nodes, all, 1..=9, NOW, WINDOW);
        assert_eq!(why, None);
        assert_eq!(placed[0].nodes, names(&["n1", "n2", "n3", "s1"]), "free nodes first");
        assert_eq!(placed[0].spares, names(&["s1"]));
        // Enough free nodes: no spare is touched.
        let (placed, _) = place(&[job("a", 3, 0, 1)], &nodes, all, 1..=9, NOW, WINDOW);
        assert!(placed[0].spares.is_empty());
        // An admin's drain, a spare that is not healthy or a silent one is never taken.
        nodes[3].spare = false;
        nodes[4].state = NodeState::Suspect;
        let (placed, why) = place(&[job("a", 4, 0, 1)], &nodes, all, 1..=9, NOW, WINDOW);
        assert!(placed.is_empty());
        assert_eq!(why.unwrap().why, "waits for 4 eligible node(s): 3 free");
        nodes[4].state = NodeState::Healthy;
        let (_, why) = place(&[job("a", 5, 0, 1)], &nodes, all, 1..=9, NOW, WINDOW);
        assert_eq!(why.unwrap().why, "waits for 5 eligible node(s): 3 free and 1 hot spare(s)");
        // No port: the spares stay where they are.
        let (placed, _) =
            place(&[job("a", 4, 0, 1)], &nodes, &BTreeSet::from([1]), 1..=1, NOW, WINDOW);
        assert!(placed.is_empty());
    }

    #[test]
    fn master_addr_is_rank_0_address_or_its_name() {
        let mut nodes = [node("n1"), node("n2")];
        let (placed, _) = place(&[job("a", 2, 0, 1)], &nodes, &BTreeSet::new(), 1..=9, NOW, WINDOW);
        assert_eq!(placed[0].master_addr, "n1");
        nodes[0].address = Some("10.0.0.1");
        let (placed, _) = place(&[job("a", 2, 0, 1)], &nodes, &BTreeSet::new(), 1..=9, NOW, WINDOW);
        assert_eq!(placed[0].master_addr, "10.0.0.1");
        let (placed, why) =
            place(&[job("a", 3, 0, 1)], &nodes, &BTreeSet::new(), 1..=9, NOW, WINDOW);
        assert!(placed.is_empty());
        assert_eq!(
            why,
            Some(Blocked { job: "a".into(), why: "waits for 3 eligible node(s): 2 free".into() })
        );
    }

    #[test]
    fn a_job_stopping_to_restart_keeps_its_place_at_the_head() {
        let nodes = [node("a"), node("b"), node("c")];
        let mut restarting = job("big", 4, 10, 1);
        restarting.stopping = true;
        let waiting = [job("small", 2, 0, 2), restarting];
        let (placements, _) = place(&waiting, &nodes, &BTreeSet::new(), 29500..=29510, NOW, WINDOW);
        assert!(placements.is_empty(), "{placements:?}");
        // Behind a higher-priority job it does not block, like any waiting job of lower priority.
        let mut low = job("low", 4, -5, 1);
        low.stopping = true;
        let (placements, _) = place(
            &[job("small", 2, 0, 2), low],
            &nodes,
            &BTreeSet::new(),
            29500..=29510,
            NOW,
            WINDOW,
        );
        assert_eq!(placements.len(), 1);
    }
}
