//! CPU plan: one shard per physical core, NUMA node by NUMA node.

use hwlocality::object::types::ObjectType;
use hwlocality::Topology;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPlacement {
    pub shard: usize,
    /// None in unpinned mode.
    pub cpu: Option<usize>,
    pub numa_node: Option<usize>,
}

/// Physical cores as (first hardware thread's OS index, NUMA node), ordered
/// by NUMA node then core.
pub fn physical_cores() -> Result<Vec<(usize, Option<usize>)>, String> {
    let topology =
        Topology::new().map_err(|e| format!("hwloc could not read the machine topology: {e}"))?;
    let nodes: Vec<(usize, Vec<usize>)> = topology
        .objects_with_type(ObjectType::NUMANode)
        .filter_map(|n| {
            let cpus = n.cpuset()?.iter_set().map(usize::from).collect();
            Some((n.os_index()?, cpus))
        })
        .collect();
    let mut cores: Vec<(usize, Option<usize>)> = topology
        .objects_with_type(ObjectType::Core)
        .filter_map(|core| core.cpuset()?.first_set().map(usize::from))
        .map(|cpu| {
            (
                cpu,
                nodes
                    .iter()
                    .find(|(_, cpus)| cpus.contains(&cpu))
                    .map(|(id, _)| *id),
            )
        })
        .collect();
    if cores.is_empty() {
        // Some virtual machines report no cores: fall back to hardware threads.
        cores = topology
            .objects_with_type(ObjectType::PU)
            .filter_map(|pu| pu.os_index())
            .map(|cpu| {
                (
                    cpu,
                    nodes
                        .iter()
                        .find(|(_, cpus)| cpus.contains(&cpu))
                        .map(|(id, _)| *id),
                )
            })
            .collect();
    }
    cores.sort_by_key(|(cpu, node)| (node.unwrap_or(0), *cpu));
    Ok(cores)
}

/// Parses "0-3,8,10-11".
pub fn parse_cpu_list(list: &str) -> Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || format!("invalid CPU list element '{part}' (expected e.g. 0-3,8)");
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) =
                    (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if a > b || b - a > 4096 {
                    return Err(bad());
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().map_err(|_| bad())?),
        }
    }
    let mut seen = std::collections::HashSet::new();
    if let Some(dup) = cpus.iter().find(|c| !seen.insert(**c)) {
        return Err(format!("CPU {dup} appears twice in the CPU list"));
    }
    if cpus.is_empty() {
        return Err("the CPU list is empty".into());
    }
    Ok(cpus)
}

/// Decides shard -> CPU. `cores` is the machine's plan (physical_cores);
/// `cpus` an explicit list; `shards` a count; `unpinned` allows more shards
/// than CPUs and pins nothing.
pub fn plan(
    cores: &[(usize, Option<usize>)],
    cpus: Option<&[usize]>,
    shards: Option<usize>,
    unpinned: bool,
) -> Result<Vec<ShardPlacement>, String> {
    if unpinned {
        let n = shards
            .or(cpus.map(<[usize]>::len))
            .unwrap_or(cores.len().max(1));
        if n == 0 {
            return Err("--shards must be at least 1".into());
        }
        return Ok((0..n)
            .map(|shard| ShardPlacement {
                shard,
                cpu: None,
                numa_node: None,
            })
            .collect());
    }
    let available: Vec<(usize, Option<usize>)> = match cpus {
        Some(list) => list
            .iter()
            .map(|cpu| {
                (
                    *cpu,
                    cores.iter().find(|(c, _)| c == cpu).and_then(|(_, n)| *n),
                )
            })
            .collect(),
        None => cores.to_vec(),
    };
    let n = shards.unwrap_or(available.len());
    if n == 0 {
        return Err("--shards must be at least 1".into());
    }
    if n > available.len() {
        return Err(format!(
            "{n} shards need {n} CPUs but only {} are available ({}); lower --shards, give --cpus, or pass --unpinned to run shards without pinning (tests)",
            available.len(),
            available.iter().map(|(c, _)| c.to_string()).collect::<Vec<_>>().join(",")
        ));
    }
    Ok(available[..n]
        .iter()
        .enumerate()
        .map(|(shard, (cpu, node))| ShardPlacement {
            shard,
            cpu: Some(*cpu),
            numa_node: *node,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,8").unwrap(), vec![0, 1, 2, 3, 8]);
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("1,1").is_err());
        assert!(parse_cpu_list("x").is_err());
        assert!(parse_cpu_list("").is_err());
    }

    #[test]
    fn plans() {
        let cores = [(0, Some(0)), (2, Some(0)), (4, Some(1)), (6, Some(1))];
        let p = plan(&cores, None, None, false).unwrap();
        assert_eq!(
            p.iter().map(|s| s.cpu.unwrap()).collect::<Vec<_>>(),
            [0, 2, 4, 6]
        );
        assert_eq!(p[2].numa_node, Some(1));
        assert_eq!(plan(&cores, None, Some(2), false).unwrap().len(), 2);
        assert!(plan(&cores, None, Some(5), false)
            .unwrap_err()
            .contains("--unpinned"));
        let p = plan(&cores, Some(&[6, 4]), None, false).unwrap();
        assert_eq!((p[0].cpu, p[0].numa_node), (Some(6), Some(1)));
        let p = plan(&cores, None, Some(8), true).unwrap();
        assert!(p.len() == 8 && p.iter().all(|s| s.cpu.is_none()));
    }

    #[test]
    fn this_machine_has_cores() {
        let cores = physical_cores().unwrap();
        assert!(!cores.is_empty());
    }
}
