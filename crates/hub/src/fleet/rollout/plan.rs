//! A rollout's waves, fixed at its start: the grammar of `--waves` (cumulative counts
//! and percentages of the selection) and the order agents take them in (canaries, then a
//! stable hash of the id, so that a second rollout over the same fleet starts with the
//! same hosts, and a new host does not reshuffle the others).

use sha2::{Digest, Sha256};

use crate::proto::labels::Labels;
use crate::proto::rollout::MAX_WAVES;

/// The label that puts an agent in the first waves.
pub(super) const CANARY_KEY: &str = "rollout";
pub(super) const CANARY_VALUE: &str = "canary";

/// One entry of `--waves`: how many of the selection have been reached once the wave
/// is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reach {
    Count(usize),
    Percent(u8),
}

impl Reach {
    fn of(self, n: usize) -> usize {
        match self {
            Reach::Count(c) => c.min(n),
            // Rounded up: 10% of 5 agents is one agent, not none.
            Reach::Percent(p) => (n * usize::from(p)).div_ceil(100),
        }
    }
}

/// Parses `--waves` (`1,10%,50%,100%`): each entry a count (1 or more) or a percentage
/// (1–100%), each reaching further than the one before.
pub(super) fn parse_waves(text: &str) -> Result<Vec<Reach>, String> {
    let mut out: Vec<Reach> = Vec::new();
    for (i, raw) in text.split(',').enumerate() {
        let entry = raw.trim();
        let n = i + 1;
        let reach = if let Some(p) = entry.strip_suffix('%') {
            match p.trim().parse::<u8>() {
                Ok(p @ 1..=100) => Reach::Percent(p),
                _ => return Err(format!("wave {n} ({entry:?}): a percentage is 1% to 100%")),
            }
        } else {
            match entry.parse::<usize>() {
                Ok(c) if c >= 1 => Reach::Count(c),
                _ => {
                    return Err(format!(
                        "wave {n} ({entry:?}): give a number of agents (1 or more) or a percentage (10%)"
                    ))
                }
            }
        };
        if let Some(before) = out.last() {
            let grows = match (*before, reach) {
                (Reach::Count(a), Reach::Count(b)) => b > a,
                (Reach::Percent(a), Reach::Percent(b)) => b > a,
                // Which reaches further depends on the selection's size.
                _ => true,
            };
            if !grows {
                return Err(format!(
                    "wave {n} ({entry:?}) reaches no further than the wave before: the list is cumulative (1,10%,50%,100%)"
                ));
            }
        }
        out.push(reach);
        if out.len() > MAX_WAVES {
            return Err(format!("more than {MAX_WAVES} waves"));
        }
    }
    Ok(out)
}

/// The size of each wave for a selection of `n` agents: waves that would add nobody are
/// left out, and a list that stops short of everyone gets a last wave of the rest.
pub(super) fn wave_sizes(reaches: &[Reach], n: usize) -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut reached = 0;
    for r in reaches {
        let upto = r.of(n).max(reached);
        if upto > reached {
            sizes.push(upto - reached);
            reached = upto;
        }
    }
    if reached < n {
        sizes.push(n - reached);
    }
    sizes
}

/// The agents in the order they take the version: those labelled `rollout=canary`
/// first, then the rest, each part by a stable hash of the id.
pub(super) fn order<'a>(agents: impl IntoIterator<Item = (&'a str, &'a Labels)>) -> Vec<String> {
    let mut keyed: Vec<(bool, [u8; 8], &str)> = agents
        .into_iter()
        .map(|(id, labels)| {
            let canary = labels.get(CANARY_KEY).map(String::as_str) == Some(CANARY_VALUE);
            let digest = Sha256::digest(id.as_bytes());
            let mut key = [0u8; 8];
            key.copy_from_slice(&digest[..8]);
            (!canary, key, id)
        })
        .collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|(_, _, id)| id.to_owned()).collect()
}

/// Each agent of `ordered` with its wave (0-based).
pub(super) fn assign(ordered: Vec<String>, sizes: &[usize]) -> Vec<(String, usize)> {
    let mut waves = sizes
        .iter()
        .enumerate()
        .flat_map(|(w, &size)| std::iter::repeat_n(w, size));
    ordered
        .into_iter()
        .map(|id| {
            let w = waves.next().unwrap_or(sizes.len().saturating_sub(1));
            (id, w)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waves_are_cumulative_counts_and_percentages_of_the_selection() {
        let w = parse_waves("1,10%,50%,100%").expect("the default");
        assert_eq!(wave_sizes(&w, 200), vec![1, 19, 80, 100]);
        // Few agents: a wave that adds nobody is left out.
        assert_eq!(wave_sizes(&w, 4), vec![1, 1, 2]);
        assert_eq!(wave_sizes(&w, 1), vec![1]);
        assert_eq!(wave_sizes(&w, 0), Vec::<usize>::new());
        // Short of everyone: the rest is one more wave.
        let w = parse_waves("2, 5").expect("counts");
        assert_eq!(wave_sizes(&w, 20), vec![2, 3, 15]);
        assert_eq!(wave_sizes(&w, 3), vec![2, 1]);
    }

    #[test]
    fn bad_waves_are_refused_naming_the_entry() {
        for (text, says) in [
            ("", "wave 1 (\"\")"),
            ("0,100%", "wave 1 (\"0\")"),
            ("1,0%", "a percentage is 1% to 100%"),
            ("1,150%", "a percentage is 1% to 100%"),
            ("50%,10%", "wave 2 (\"10%\") reaches no further"),
            ("3,3", "wave 2 (\"3\") reaches no further"),
            ("1,x", "wave 2 (\"x\")"),
            ("1,,2", "wave 2 (\"\")"),
        ] {
            let e = parse_waves(text).expect_err(text);
            assert!(e.contains(says), "{text}: {e}");
        }
        let many: Vec<String> = (1..=21).map(|n| n.to_string()).collect();
        assert!(parse_waves(&many.join(",")).is_err());
    }

    #[test]
    fn canaries_go_first_and_the_order_is_stable() {
        let canary: Labels = [("rollout".to_owned(), "canary".to_owned())].into();
        let none = Labels::new();
        let ids: Vec<String> = (0..50).map(|n| format!("host-{n}")).collect();
        let all: Vec<(&str, &Labels)> = ids
            .iter()
            .map(|id| {
                let l = if id == "host-17" { &canary } else { &none };
                (id.as_str(), l)
            })
            .collect();
        let first = order(all.iter().copied());
        assert_eq!(first[0], "host-17");
        let mut reversed = all.clone();
        reversed.reverse();
        assert_eq!(
            order(reversed.iter().copied()),
            first,
            "input order is no input"
        );
        // A new agent does not move the others relative to each other.
        let extra = "host-new".to_owned();
        let mut more = all.clone();
        more.push((extra.as_str(), &none));
        let with: Vec<String> = order(more)
            .into_iter()
            .filter(|id| id != "host-new")
            .collect();
        assert_eq!(with, first);

        let placed = assign(first.clone(), &[1, 9, 40]);
        assert_eq!(placed[0], ("host-17".to_owned(), 0));
        assert_eq!(placed.iter().filter(|(_, w)| *w == 1).count(), 9);
        assert_eq!(placed.iter().filter(|(_, w)| *w == 2).count(), 40);
    }
}
