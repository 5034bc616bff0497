//! Can this Redis do what the flags ask? Read from `INFO` of every primary (no `CONFIG`, which
//! managed Redis often disables), checked at start and by `/healthz`, and the byte budget that
//! refuses new sessions before Redis refuses writes.

/// Percent of a primary's `maxmemory` the byte budget defaults to.
pub const DEFAULT_BUDGET_PERCENT: u64 = 80;
/// An explicit budget must stay under this percent of `maxmemory`: above it Redis would refuse
/// writes before the service refuses new sessions.
pub const MAX_BUDGET_PERCENT: u64 = 95;

/// What one primary reports that the flags depend on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// `connected_slaves`: replicas that can acknowledge a `WAIT`.
    pub replicas: u64,
    /// `maxmemory` (0: unlimited).
    pub maxmemory: u64,
    /// `maxmemory_policy`.
    pub policy: String,
    /// `used_memory`.
    pub used: u64,
}

/// The fields of `INFO` text this service needs; missing ones stay 0 / empty.
pub fn parse_info(text: &str) -> NodeInfo {
    let mut n = NodeInfo::default();
    for line in text.lines() {
        let Some((k, v)) = line.trim_end_matches('\r').split_once(':') else {
            continue;
        };
        match k {
            "connected_slaves" => n.replicas = v.parse().unwrap_or(0),
            "maxmemory" => n.maxmemory = v.parse().unwrap_or(0),
            "maxmemory_policy" => n.policy = v.to_owned(),
            "used_memory" => n.used = v.parse().unwrap_or(0),
            _ => {}
        }
    }
    n
}

/// The byte budget of one primary: the flag, else [`DEFAULT_BUDGET_PERCENT`] of its
/// `maxmemory`, else none (an unlimited Redis).
pub fn budget(node: &NodeInfo, flag: Option<u64>) -> Option<u64> {
    flag.or_else(|| (node.maxmemory > 0).then(|| node.maxmemory / 100 * DEFAULT_BUDGET_PERCENT))
}

/// The primaries above `high_percent` of their budget: (used, budget) of the fullest.
pub fn over_budget(nodes: &[NodeInfo], flag: Option<u64>, high_percent: u64) -> Option<(u64, u64)> {
    nodes
        .iter()
        .filter_map(|n| budget(n, flag).map(|b| (n.used, b)))
        .filter(|(used, b)| u128::from(*used) * 100 > u128::from(*b) * u128::from(high_percent))
        .max_by_key(|(used, b)| u128::from(*used) * 1000 / u128::from((*b).max(1)))
}

/// What is wrong with this deployment shape for these flags (each naming what to change),
/// and what merely deserves a warning.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Findings {
    pub problems: Vec<String>,
    pub warnings: Vec<String>,
}

pub fn check(nodes: &[NodeInfo], wait_replicas: u32, budget_flag: Option<u64>) -> Findings {
    let mut f = Findings::default();
    if nodes.is_empty() {
        return f;
    }
    let fewest = nodes.iter().map(|n| n.replicas).min().unwrap_or(0);
    if u64::from(wait_replicas) > fewest {
        f.problems.push(format!(
            "--redis-wait-replicas is {wait_replicas}, but a primary has {fewest} connected \
             replica(s): every record would be refused (WAIT never completes); set \
             MCP_OWNERSHIP_REDIS_WAIT_REPLICAS={fewest} or give every primary {wait_replicas} \
             replica(s)"
        ));
    }
    if let Some(p) = nodes
        .iter()
        .map(|n| &n.policy)
        .find(|p| p.starts_with("allkeys-"))
    {
        f.problems.push(format!(
            "Redis maxmemory-policy {p} may evict the owner epochs and the session index (a \
             stream of a replica marked gone could continue); set maxmemory-policy noeviction \
             in Redis: the service refuses new sessions itself before Redis is full \
             (MCP_OWNERSHIP_REDIS_MAX_BYTES)"
        ));
    } else if let Some(p) = nodes
        .iter()
        .map(|n| &n.policy)
        .find(|p| p.starts_with("volatile-"))
    {
        f.warnings.push(format!(
            "Redis maxmemory-policy {p} evicts session keys when Redis is full (their cursors \
             get new streams); noeviction with MCP_OWNERSHIP_REDIS_MAX_BYTES refuses new \
             sessions instead"
        ));
    }
    if let Some(b) = budget_flag {
        if let Some(n) = nodes.iter().find(|n| {
            n.maxmemory > 0
                && u128::from(b) * 100 > u128::from(n.maxmemory) * u128::from(MAX_BUDGET_PERCENT)
        }) {
            f.problems.push(format!(
                "--redis-max-bytes {b} is not below {MAX_BUDGET_PERCENT}% of a primary's \
                 maxmemory {}: Redis would refuse writes before the service refuses new \
                 sessions; set MCP_OWNERSHIP_REDIS_MAX_BYTES to at most {}",
                n.maxmemory,
                n.maxmemory / 100 * DEFAULT_BUDGET_PERCENT
            ));
        }
    }
    if nodes
        .iter()
        .any(|n| n.maxmemory == 0 && budget_flag.is_none())
    {
        f.warnings.push(
            "Redis has no maxmemory and MCP_OWNERSHIP_REDIS_MAX_BYTES is unset: nothing bounds \
             the bytes but --max-sessions (README: sizing)"
                .to_owned(),
        );
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(replicas: u64, maxmemory: u64, policy: &str, used: u64) -> NodeInfo {
        NodeInfo {
            replicas,
            maxmemory,
            policy: policy.into(),
            used,
        }
    }

    #[test]
    fn info_fields() {
        let n = parse_info(
            "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n# Memory\r\nused_memory:1234\r\n\
             maxmemory:16777216\r\nmaxmemory_policy:noeviction\r\n",
        );
        assert_eq!(n, node(2, 16_777_216, "noeviction", 1234));
    }

    #[test]
    fn replica_less_primaries_name_the_variable() {
        let f = check(
            &[node(1, 0, "noeviction", 0), node(0, 0, "noeviction", 0)],
            1,
            None,
        );
        assert_eq!(f.problems.len(), 1, "{f:?}");
        assert!(
            f.problems[0].contains("MCP_OWNERSHIP_REDIS_WAIT_REPLICAS=0"),
            "{f:?}"
        );
        assert!(check(&[node(1, 0, "noeviction", 0)], 1, Some(1 << 20))
            .problems
            .is_empty());
        assert!(check(&[node(0, 0, "noeviction", 0)], 0, None)
            .problems
            .is_empty());
    }

    #[test]
    fn policies_and_budgets() {
        let f = check(&[node(0, 1 << 30, "allkeys-lru", 0)], 0, None);
        assert!(f.problems[0].contains("noeviction"), "{f:?}");
        let f = check(&[node(0, 1 << 30, "volatile-lru", 0)], 0, None);
        assert!(f.problems.is_empty() && f.warnings.len() == 1, "{f:?}");
        let f = check(&[node(0, 1000 << 20, "noeviction", 0)], 0, Some(990 << 20));
        assert!(
            f.problems[0].contains("MCP_OWNERSHIP_REDIS_MAX_BYTES"),
            "{f:?}"
        );
        assert!(
            check(&[node(0, 1000 << 20, "noeviction", 0)], 0, Some(800 << 20))
                .problems
                .is_empty()
        );
        // The budget: the flag, else 80% of maxmemory, else none.
        let n = node(0, 1000, "noeviction", 0);
        assert_eq!(budget(&n, None), Some(800));
        assert_eq!(budget(&n, Some(500)), Some(500));
        assert_eq!(budget(&node(0, 0, "noeviction", 0), None), None);
        let full = [
            node(0, 1000, "noeviction", 750),
            node(0, 1000, "noeviction", 100),
        ];
        assert_eq!(over_budget(&full, None, 90), Some((750, 800)));
        assert_eq!(over_budget(&full, None, 95), None);
        assert_eq!(
            over_budget(&[node(0, 0, "noeviction", 1 << 40)], None, 90),
            None
        );
    }
}
