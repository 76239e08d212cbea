//! Who this rank is and where the ranks meet: the job launcher's environment (torchrun's
//! variables and the checkpoint protocol's job id and restart count).

use crate::checkpoint::{EnvReader, Need, vars};

/// Who this rank is and where the ranks meet (the job launcher's environment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    /// This rank, `0..world_size` (`RANK`).
    pub rank: usize,
    /// Number of ranks in the job (`WORLD_SIZE`).
    pub world_size: usize,
    /// Host of rank 0's rendezvous (`MASTER_ADDR`).
    pub master_addr: String,
    /// Port of rank 0's rendezvous (`MASTER_PORT`).
    pub master_port: u16,
    /// One incarnation of one job (`FLEETMEND_JOB_ID#FLEETMEND_RESTART_COUNT`): rank 0 turns away
    /// ranks of another job or of an earlier restart that are still knocking.
    pub run_id: String,
}

/// The launcher's environment was missing or wrong; every problem is listed.
#[derive(Debug, thiserror::Error)]
#[error("reading the rank's environment: {}", .problems.join("; "))]
pub struct MembershipError {
    /// One line per variable, naming it.
    pub problems: Vec<String>,
}

impl Membership {
    /// A run of one: no rendezvous, no peers.
    pub fn alone() -> Membership {
        Membership {
            rank: 0,
            world_size: 1,
            master_addr: "127.0.0.1".to_string(),
            master_port: 0,
            run_id: "local#0".to_string(),
        }
    }

    /// Reads `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` (both optional for a world of one),
    /// `FLEETMEND_JOB_ID` (default `local`) and `FLEETMEND_RESTART_COUNT` (default 0), parsed as
    /// the checkpoint protocol's [`ProtocolEnv`](crate::checkpoint::ProtocolEnv) parses them.
    /// Without `RANK` and `WORLD_SIZE` this is a run of one ([`Membership::alone`]).
    pub fn from_env() -> Result<Membership, MembershipError> {
        Membership::from_vars(|name| std::env::var_os(name))
    }

    /// [`Membership::from_env`] with the variables looked up through `var`.
    pub fn from_vars<V: Into<std::ffi::OsString>>(
        var: impl FnMut(&str) -> Option<V>,
    ) -> Result<Membership, MembershipError> {
        let mut env = EnvReader::new(var);
        if !env.is_set(vars::RANK) && !env.is_set(vars::WORLD_SIZE) {
            return Ok(Membership::alone());
        }
        let rank = env.number::<u32>(vars::RANK, Need::Required);
        let world_size = env.number::<u32>(vars::WORLD_SIZE, Need::Required);
        let peers = if world_size == Some(1) { Need::Optional } else { Need::Required };
        let master_addr = env.text(vars::MASTER_ADDR, peers);
        let master_port = env.number::<u16>(vars::MASTER_PORT, peers);
        let job_id = env.text(vars::JOB_ID, Need::Optional);
        let restart = env.number::<u32>(vars::RESTART_COUNT, Need::Optional);
        let problems = env.finish();
        if !problems.is_empty() {
            return Err(MembershipError {
                problems: problems.iter().map(ToString::to_string).collect(),
            });
        }
        let to_usize = |value: Option<u32>| value.and_then(|v| usize::try_from(v).ok());
        let membership = Membership {
            rank: to_usize(rank).unwrap_or(0),
            world_size: to_usize(world_size).unwrap_or(0),
            master_addr: master_addr.unwrap_or_else(|| "127.0.0.1".to_string()),
            master_port: master_port.unwrap_or(0),
            run_id: format!("{}#{}", job_id.as_deref().unwrap_or("local"), restart.unwrap_or(0)),
        };
        let problems = membership.problems();
        if problems.is_empty() { Ok(membership) } else { Err(MembershipError { problems }) }
    }

    /// Every problem with these values, each naming its field; empty when usable.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.world_size == 0 {
            problems.push("world_size: must be at least 1".to_string());
        } else if self.rank >= self.world_size {
            problems.push(format!(
                "rank: {} is not a rank of a world of {}",
                self.rank, self.world_size
            ));
        }
        if self.world_size > 1 {
            if self.master_addr.trim().is_empty() {
                problems.push("master_addr: empty".to_string());
            }
            if self.master_port == 0 {
                problems.push("master_port: must not be 0".to_string());
            }
        }
        if self.run_id.is_empty() {
            problems.push("run_id: empty".to_string());
        }
        problems
    }

    pub(super) fn master_endpoint(&self) -> String {
        if self.master_addr.contains(':') {
            format!("[{}]:{}", self.master_addr, self.master_port)
        } else {
            format!("{}:{}", self.master_addr, self.master_port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn membership_reads_the_launcher_environment() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
        };
        let membership = Membership::from_vars(vars(&[
            ("RANK", "2"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("FLEETMEND_JOB_ID", "job-7"),
            ("FLEETMEND_RESTART_COUNT", "3"),
        ]))
        .unwrap();
        assert_eq!(
            membership,
            Membership {
                rank: 2,
                world_size: 4,
                master_addr: "10.0.0.1".into(),
                master_port: 29500,
                run_id: "job-7#3".into(),
            }
        );
        let alone = Membership::from_vars(vars(&[("RANK", "0"), ("WORLD_SIZE", "1")])).unwrap();
        assert_eq!((alone.world_size, alone.run_id.as_str()), (1, "local#0"));
        assert_eq!(Membership::from_vars(vars(&[])).unwrap(), Membership::alone());

        let error = Membership::from_vars(vars(&[
            ("RANK", "x"),
            ("WORLD_SIZE", "4"),
            ("MASTER_PORT", "70000"),
        ]))
        .unwrap_err();
        let text = error.to_string();
        for var in ["RANK", "MASTER_ADDR", "MASTER_PORT"] {
            assert!(text.contains(var), "{text}");
        }
        let error = Membership::from_vars(vars(&[
            ("RANK", "4"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ]))
        .unwrap_err();
        assert!(error.to_string().contains("rank: 4 is not a rank of a world of 4"), "{error}");
    }
}
