//! Compares two builds of `profile_replay` in alternating pairs and says whether the second is faster.
//!
//! `cargo run --release -p pipelines --example ab_replay -- A B [PAIRS] [AGENTS ROUNDS]`, where `A` and
//! `B` are copies of `target/release/examples/profile_replay` built from the two versions of the code
//! (default 20 pairs of `5000 23`; `RUNS` replays per process, default 3, the first of which, in fresh
//! memory, is left out of the comparison).
//!
//! Why pairs, alternating: this VM's speed drifts by about ±5 % from one minute to the next, so two
//! single runs say nothing about a change of a few per cent. Each pair runs A and B one right after the
//! other (A first in odd pairs, B first in even ones), and the comparison is the ratio of their times
//! (B / A), which the drift moves much less than either time. The mean of the ratios' logarithms gives
//! the geometric mean ratio and its 95 % confidence interval (Student's t): a change is shown only when
//! the interval leaves 1. As a rule of thumb, a 2 % change takes 20–25 pairs to show.

use std::process::Command;
use std::time::Duration;

/// Student's t at 97.5 % for 1..=30 degrees of freedom (two-sided 95 %); 1.96 beyond.
const T_975: [f64; 30] = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131, 2.120,
    2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
];

fn main() {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let [first, second, ..] = arguments.as_slice() else {
        eprintln!("usage: ab_replay A B [PAIRS] [AGENTS ROUNDS]");
        std::process::exit(2);
    };
    let number =
        |index: usize, default: usize| arguments.get(index).and_then(|value| value.parse().ok()).unwrap_or(default);
    let pairs = number(2, 20).max(2);
    let workload = [number(3, 5_000).to_string(), number(4, 23).to_string()];
    let mut log_ratios = Vec::with_capacity(pairs);
    for pair in 1..=pairs {
        let (time_a, time_b) = if pair % 2 == 1 {
            let time_a = warm_replays(first, &workload);
            (time_a, warm_replays(second, &workload))
        } else {
            let time_b = warm_replays(second, &workload);
            (warm_replays(first, &workload), time_b)
        };
        let ratio = time_b.as_secs_f64() / time_a.as_secs_f64();
        println!("pair {pair:>2}: A {:.3} s, B {:.3} s, B/A {ratio:.3}", time_a.as_secs_f64(), time_b.as_secs_f64());
        log_ratios.push(ratio.ln());
    }
    report(&log_ratios);
}

/// The time `binary` took for its warm replays (all but the first) of the workload.
fn warm_replays(binary: &str, workload: &[String; 2]) -> Duration {
    let runs = std::env::var("RUNS").unwrap_or_else(|_| "3".to_string());
    let output = Command::new(binary).args(workload).env("RUNS", runs).output().expect("the replay binary runs");
    assert!(output.status.success(), "{binary} failed: {}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let times: Vec<Duration> = stdout.lines().filter_map(replay_time).collect();
    assert!(times.len() >= 2, "{binary}: set RUNS to 2 or more (got {} replays)", times.len());
    times[1..].iter().sum()
}

/// The duration in a line `… input events (…) in 2.25s: …` that `profile_replay` prints per replay.
fn replay_time(line: &str) -> Option<Duration> {
    let (_, after) = line.split_once(" in ")?;
    let (text, _) = after.split_once(':')?;
    let (value, seconds_per_unit) = if let Some(value) = text.strip_suffix("ms") {
        (value, 1e-3)
    } else if let Some(value) = text.strip_suffix("µs") {
        (value, 1e-6)
    } else {
        (text.strip_suffix('s')?, 1.0)
    };
    value.parse::<f64>().ok().map(|value| Duration::from_secs_f64(value * seconds_per_unit))
}

/// Prints the geometric mean ratio, its 95 % confidence interval and the pairs B won.
fn report(log_ratios: &[f64]) {
    let count = log_ratios.len() as f64;
    let mean = log_ratios.iter().sum::<f64>() / count;
    let variance = log_ratios.iter().map(|value| (value - mean).powi(2)).sum::<f64>() / (count - 1.0);
    let t = T_975.get(log_ratios.len() - 2).copied().unwrap_or(1.96);
    let half_width = t * (variance / count).sqrt();
    let faster = log_ratios.iter().filter(|value| **value < 0.0).count();
    println!(
        "B/A over {} pairs: {:.3} (95 % interval {:.3}–{:.3}); B faster in {faster} of them",
        log_ratios.len(),
        mean.exp(),
        (mean - half_width).exp(),
        (mean + half_width).exp()
    );
    let verdict = if mean + half_width < 0.0 {
        "B is faster"
    } else if mean - half_width > 0.0 {
        "B is slower"
    } else {
        "no difference shown"
    };
    println!("{verdict}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_times_profile_replay_prints() {
        let line =
            "1038850 input events (1189473 with the provider's crawl_result answers) in 2.259218887s: 459827 inputs/s";
        assert_eq!(replay_time(line), Some(Duration::from_secs_f64(2.259218887)));
        assert_eq!(
            replay_time("121 input events (129 with …) in 998.5ms: 1 inputs/s"),
            Some(Duration::from_secs_f64(0.9985))
        );
        assert_eq!(replay_time("workload: 5000 agents"), None);
    }
}
