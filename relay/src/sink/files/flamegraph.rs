//! Flamegraph sink: an interactive SVG of a [`LabeledProfile`], drawn by inferno (the Rust port of
//! flamegraph.pl) from the folded lines of [`super::folded`], so both show the same names;
//! drawn top-down, the root first, so the browser opens on the widest frames.
//!
//! Invariants: every profile gives a valid SVG; one without samples (which inferno refuses)
//! gives a small SVG saying "no samples". Colours derive from function names, so rewriting the
//! same profile gives the same file. Rendering only, into the writer the files sink gives (its
//! file): the document is streamed there as inferno draws it.

use super::FoldedRoot;
use std::io;

use inferno::flamegraph::{
    self,
    color::{BasicPalette, MultiPalette},
    Direction, Options, Palette,
};

use super::folded;
use crate::{labels::labeled::LabeledProfile, model::SampleKind};

const TITLE: &str = "ember CPU flamegraph";
const OFF_CPU_TITLE: &str = "ember off-CPU flamegraph";

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FlamegraphError {
    #[error("`inferno::flamegraph::from_lines` failed (or writing what it drew)")]
    Render(#[source] io::Error),
}

/// The SVG document of `profile`.
#[cfg(test)]
pub fn render(profile: &LabeledProfile) -> Result<Vec<u8>, FlamegraphError> {
    render_cpu(profile, FoldedRoot::Process, true)
}

/// Writes the SVG document of `profile`, its root frames named per `--folded-root`, to `out`
/// as inferno draws it: the document is never held whole.
pub fn write_with(
    profile: &LabeledProfile,
    root: FoldedRoot,
    out: &mut dyn io::Write,
) -> Result<(), FlamegraphError> {
    write_cpu(profile, root, true, out)
}

/// [`write_with`] into memory, its lines pruned to what is drawn, or (`prune` false) every
/// line as inferno reads a folded file: the tests compare both.
#[cfg(test)]
pub(super) fn render_cpu(
    profile: &LabeledProfile,
    root: FoldedRoot,
    prune: bool,
) -> Result<Vec<u8>, FlamegraphError> {
    let mut svg = Vec::new();
    write_cpu(profile, root, prune, &mut svg)?;
    Ok(svg)
}

/// [`write_with`], pruned or not (see [`render_cpu`]).
fn write_cpu(
    profile: &LabeledProfile,
    root: FoldedRoot,
    prune: bool,
    out: &mut dyn io::Write,
) -> Result<(), FlamegraphError> {
    let subtitle = subtitle(profile);
    let mut options = Options::default();
    let lines = lines_for(profile, root, SampleKind::Cpu, &mut options, prune);
    if lines.is_empty() {
        return out
            .write_all(no_samples_svg(TITLE, &subtitle).as_bytes())
            .map_err(FlamegraphError::Render);
    }
    options.title = TITLE.to_owned();
    options.subtitle = Some(subtitle);
    options.count_name = "samples".to_owned();
    // Drawn top-down (an icicle graph: the root at the top, each function's callees below it):
    // a whole machine's stacks make an SVG thousands of pixels tall, and drawn bottom-up a
    // browser opens it on an empty first screen far above the graph's base.
    options.direction = Direction::Inverted;
    // The built-in palette that tells kernel frames (`_[k]`, orange) from user code (C++/Rust
    // `::` names yellow, others red).
    options.colors = Palette::Multi(MultiPalette::Perl);
    // Colour by name hash, not at random: same input, same SVG.
    options.hash = true;
    flamegraph::from_lines(&mut options, in_inferno_order(&lines), out)
        .map_err(FlamegraphError::Render)
}

/// The off-CPU flame graph (`flamegraph.offcpu.svg`): where threads blocked, each frame as wide
/// as the nanoseconds spent blocked under it, in inferno's blue `io` palette so it is not taken
/// for the CPU graph at a glance. Written to `out` as drawn.
pub fn write_off_cpu(
    profile: &LabeledProfile,
    root: FoldedRoot,
    out: &mut dyn io::Write,
) -> Result<(), FlamegraphError> {
    let mut options = Options::default();
    let lines = lines_for(profile, root, SampleKind::OffCpu, &mut options, true);
    let total = profile.total_of(SampleKind::OffCpu);
    let subtitle = range(
        format!("{:.3} s off-CPU (blocked)", total as f64 / 1e9),
        profile,
    );
    if lines.is_empty() {
        return out
            .write_all(no_samples_svg(OFF_CPU_TITLE, &subtitle).as_bytes())
            .map_err(FlamegraphError::Render);
    }
    options.title = OFF_CPU_TITLE.to_owned();
    options.subtitle = Some(subtitle);
    options.count_name = "ns".to_owned();
    options.direction = Direction::Inverted;
    options.colors = Palette::Basic(BasicPalette::Io);
    options.hash = true;
    flamegraph::from_lines(&mut options, in_inferno_order(&lines), out)
        .map_err(FlamegraphError::Render)
}

/// The folded lines inferno draws `kind`'s graph from, in one string whose lines it borrows
/// (not a string per line), already in the order it would sort them into (`options.no_sort`).
/// Pruned (`folded::render_for_flamegraph`), they are the lines under the frames wide enough
/// to be drawn at `options.min_width`: inferno makes a frame for every node of the graph
/// before it drops the narrow ones, and a window of hundreds of thousands of distinct stacks
/// made millions of them (0.9-1 GiB) for a picture of a few thousand.
fn lines_for(
    profile: &LabeledProfile,
    root: FoldedRoot,
    kind: SampleKind,
    options: &mut Options<'_>,
    prune: bool,
) -> String {
    if !prune {
        // Every line, inferno sorting them (the tests' reference).
        return folded::render_of(profile, root, kind);
    }
    options.no_sort = true;
    folded::render_for_flamegraph(profile, root, kind, options.min_width)
}

/// The lines in an order inferno accepts from lines it does not sort itself (`no_sort`): it
/// refuses a line whose stack sorts below the stack of the line before it ("unsorted input
/// lines detected") and draws nothing. The pruned lines are not always in that order: a line
/// cut to end at a narrow node `p;f` stays where its run began, after a sibling `p;f b;...`
/// (`[unknown] libc.so.6` beside `[unknown]`), whose stack sorts above it. Sorted whole, as
/// inferno sorts lines itself, each line's stack is at most the next line. A moved line only
/// swaps places with such a sibling; every node keeps its width.
fn in_inferno_order(lines: &str) -> Vec<&str> {
    let mut ordered: Vec<&str> = lines.lines().map(str::trim).collect();
    ordered.sort_unstable();
    ordered
}

/// "N samples at F Hz, from START to END UTC" (the range left out when unknown).
fn subtitle(profile: &LabeledProfile) -> String {
    range(
        format!(
            "{} samples at {} Hz",
            profile.total_samples(),
            profile.frequency_hz
        ),
        profile,
    )
}

/// `what`, then ", from START to END UTC" (left out when unknown).
fn range(what: String, profile: &LabeledProfile) -> String {
    let mut subtitle = what;
    if profile.start_unix_ns != 0 {
        subtitle.push_str(&format!(
            ", from {} to {} UTC",
            utc(profile.start_unix_ns),
            utc(profile.end_unix_ns)
        ));
    }
    subtitle
}

/// The SVG for a profile inferno cannot draw. Its texts are ASCII digits and words made here,
/// so nothing needs escaping.
fn no_samples_svg(title: &str, subtitle: &str) -> String {
    format!(
        r##"<?xml version="1.0" standalone="no"?>
<svg version="1.1" width="1200" height="90" viewBox="0 0 1200 90" xmlns="http://www.w3.org/2000/svg">
<rect x="0" y="0" width="100%" height="100%" fill="#eeeeee"/>
<text x="600" y="24" text-anchor="middle" font-family="Verdana" font-size="17">{title}</text>
<text x="600" y="48" text-anchor="middle" font-family="Verdana" font-size="12" fill="#a0a0a0">{subtitle}</text>
<text x="600" y="74" text-anchor="middle" font-family="Verdana" font-size="14">no samples</text>
</svg>
"##
    )
}

/// `YYYY-MM-DD HH:MM:SS` of a Unix time in nanoseconds, in UTC.
fn utc(unix_ns: u64) -> String {
    let seconds = unix_ns / 1_000_000_000;
    let (year, month, day) = civil_from_days(seconds / 86_400);
    let time = seconds % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        time / 3_600,
        time % 3_600 / 60,
        time % 60
    )
}

/// (year, month, day) of a day count since 1970-01-01: Howard Hinnant's `civil_from_days`
/// (<https://howardhinnant.github.io/date_algorithms.html>), unsigned since times here are never
/// before 1970.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468; // days since 0000-03-01
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let march_month = (5 * day_of_year + 2) / 153; // 0 = March
    let day = day_of_year - (153 * march_month + 2) / 5 + 1;
    let month = if march_month < 10 {
        march_month + 3
    } else {
        march_month - 9
    };
    let year = era * 400 + year_of_era + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::model::{Frame, FrameKind, SymbolizedSample, Thread};

    const START: u64 = 1_700_000_000_000_000_000;

    fn frame(function: &str, kind: FrameKind) -> Frame {
        Frame::bare(function, kind, 0x1000)
    }

    fn profile() -> LabeledProfile {
        let mut profile = LabeledProfile::new(99);
        let sample = SymbolizedSample {
            thread: Thread::bare((1, 1), "app", "app", "/usr/bin/app"),
            stack: vec![
                frame("do_syscall_64", FrameKind::Kernel),
                frame("compute<T>", FrameKind::Native),
                frame("main", FrameKind::Native),
            ]
            .into(),
            count: 7,
        };
        profile.add(sample, START, START + 60_000_000_000);
        profile
    }

    fn text(svg: &[u8]) -> &str {
        std::str::from_utf8(svg).unwrap()
    }

    #[test]
    fn svg_shows_title_subtitle_and_every_frame() {
        // Given a stack through the kernel
        let profile = profile();

        // When drawn
        let svg = render(&profile).unwrap();

        // Then the SVG names every frame (escaped; inferno shows `_[k]` frames without the
        // suffix, which only picks their colour), the title and the time range
        let svg = text(&svg);
        assert!(svg.starts_with("<?xml"), "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"));
        for name in ["app", "main", "compute&lt;T&gt;", "do_syscall_64", TITLE] {
            assert!(svg.contains(name), "{name} missing from the SVG");
        }
        assert!(!svg.contains("_[k]"));
        assert!(
            svg.contains("7 samples at 99 Hz, from 2023-11-14 22:13:20 to 2023-11-14 22:14:20 UTC")
        );
    }

    /// The `y` of the rectangle drawn for the frame titled `name`.
    fn frame_y(svg: &str, name: &str) -> f64 {
        let at = svg
            .find(&format!("<title>{name} ("))
            .unwrap_or_else(|| panic!("no frame {name}"));
        let rect = &svg[at..];
        let y = &rect[rect.find(" y=\"").unwrap() + 4..];
        y[..y.find('"').unwrap()].parse().unwrap()
    }

    #[test]
    fn the_root_is_drawn_first_so_the_first_screen_shows_the_graph() {
        // When a stack main -> compute -> do_syscall_64 is drawn
        let svg = render(&profile()).unwrap();
        let svg = text(&svg);
        // Then the root is at the top and each callee below its caller
        let ys: Vec<f64> = ["all", "app", "main", "compute&lt;T&gt;", "do_syscall_64"]
            .iter()
            .map(|name| frame_y(svg, name))
            .collect();
        assert!(ys.windows(2).all(|w| w[0] < w[1]), "{ys:?}");
    }

    /// A window like the churn soak's: `random` stacks each drawn once down a binary tree of
    /// functions 12 to 20 levels deep (so nearly all distinct, most of the graph's nodes far narrower than it
    /// draws), a few wide stacks, and names inferno reads specially: a process name with
    /// blanks before it, one starting `# ` (a comment line to inferno), names that are
    /// prefixes of others and names sorting around `;`.
    fn churn_window(random: u32) -> LabeledProfile {
        let mut profile = LabeledProfile::new(4999);
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let processes = ["distinct", "  blank", "# hidden", "p:q", "p<", "p"];
        for i in 0..random {
            let bits = next();
            let depth = 12 + (bits % 9) as usize;
            let mut root_first = vec![frame("main", FrameKind::Native)];
            root_first.extend((0..depth).map(|level| {
                let pair = [["a", "a b"], ["a:x", "a<"], ["ab", "a"]][level % 3];
                let side = pair[(bits >> (8 + level)) as usize & 1];
                frame(&format!("{side}_{level}"), FrameKind::Native)
            }));
            let process = processes[(i % processes.len() as u32) as usize];
            profile.add(
                SymbolizedSample {
                    thread: Thread::bare((i % 7 + 1, i % 7 + 1), process, process, "/bin/x"),
                    stack: root_first.into_iter().rev().collect::<Vec<_>>().into(),
                    count: 1 + next() % 3,
                },
                START,
                START + 60_000_000_000,
            );
        }
        for (leaf, count) in [("hot", 200_000), ("warm", 700), ("tepid", 9)] {
            profile.add(
                SymbolizedSample {
                    thread: Thread::bare((1, 1), "distinct", "distinct", "/bin/x"),
                    stack: vec![
                        frame(leaf, FrameKind::Native),
                        frame("a_0", FrameKind::Native),
                        frame("main", FrameKind::Native),
                    ]
                    .into(),
                    count,
                },
                START,
                START + 60_000_000_000,
            );
        }
        profile
    }

    #[test]
    fn a_narrow_node_beside_a_sibling_whose_name_continues_its_own_is_drawn() {
        // Given a wide stack through `f b` (as `[unknown] libc.so.6` beside `[unknown]`) and
        // two stacks through a sibling `f` too narrow to draw, whose lines are pruned to one
        // that ends at `f` and then sorts before `f b` to inferno, which refuses lines out of
        // its order and draws nothing
        let mut profile = LabeledProfile::new(99);
        for (names, count) in [
            (&["main", "f b", "g"][..], 100_000),
            (&["main", "f", "h1"], 1),
            (&["main", "f", "h2"], 1),
        ] {
            profile.add(
                SymbolizedSample {
                    thread: Thread::bare((1, 1), "app", "app", "/usr/bin/app"),
                    stack: names
                        .iter()
                        .rev()
                        .map(|name| frame(name, FrameKind::Native))
                        .collect::<Vec<_>>()
                        .into(),
                    count,
                },
                START,
                START + 60_000_000_000,
            );
        }
        // When drawn
        let svg = render(&profile).expect("drawn");
        // Then the wide stack is in it
        let svg = text(&svg);
        assert!(svg.contains(">f b<") && svg.contains(">g<"), "{svg}");
    }

    #[test]
    fn pruning_the_lines_narrower_than_drawn_leaves_the_same_svg() {
        // Given a window of 40,000 mostly distinct stacks
        let profile = churn_window(40_000);
        for root in [FoldedRoot::Process, FoldedRoot::Service] {
            // When drawn from every line (inferno sorting them) and from the pruned lines
            let every = render_cpu(&profile, root, false).unwrap();
            let pruned = render_cpu(&profile, root, true).unwrap();
            // Then the SVG is the same, byte for byte, while inferno read a small part of the
            // lines (so it made a frame for far fewer nodes)
            assert!(every == pruned, "pruning changed the SVG");
            let all_lines = folded::render_with(&profile, root).lines().count();
            let mut options = Options::default();
            let kept = lines_for(&profile, root, SampleKind::Cpu, &mut options, true)
                .lines()
                .count();
            assert!(
                kept * 3 < all_lines,
                "{kept} of {all_lines} lines kept: nothing pruned"
            );
        }
    }

    /// The frames inferno makes from `lines` (folded, in the order it reads them): one for each
    /// name a line does not share with the line before it (comment lines it skips).
    fn frames_made(lines: &str) -> usize {
        let mut previous: Vec<&str> = Vec::new();
        let mut made = 0;
        for line in lines.lines().filter(|l| !l.trim_start().starts_with("# ")) {
            let stack = line.rsplit_once(' ').map_or(line, |(stack, _)| stack);
            let names: Vec<&str> = stack.split(';').collect();
            let shared = (names.iter().zip(&previous))
                .take_while(|(a, b)| a == b)
                .count();
            made += names.len() - shared;
            previous = names;
        }
        made
    }

    #[test]
    fn inferno_makes_a_frame_per_drawn_node_and_per_pruned_line_not_per_node_below_it() {
        // Given a window of 40,000 mostly distinct stacks, 12 to 20 frames deep
        let profile = churn_window(40_000);
        let mut options = Options::default();
        let pruned = lines_for(
            &profile,
            FoldedRoot::Process,
            SampleKind::Cpu,
            &mut options,
            true,
        );
        // When drawn from the pruned lines
        let svg = render_cpu(&profile, FoldedRoot::Process, true).unwrap();
        let drawn = text(&svg).matches("<g><title>").count();
        // Then inferno made a frame for each drawn node and at most one more per line (the
        // narrow node the line stands for), none for the nodes below those
        let (made, lines) = (frames_made(&pruned), pruned.lines().count());
        eprintln!("{made} frames made for {drawn} drawn from {lines} lines");
        assert!(
            made <= drawn + lines,
            "{made} frames made for {drawn} drawn from {lines} lines"
        );
    }

    #[test]
    fn same_profile_same_svg() {
        assert_eq!(render(&profile()).unwrap(), render(&profile()).unwrap());
    }

    #[test]
    fn empty_profile_gives_a_no_samples_svg() {
        // Given a profile without samples
        let profile = LabeledProfile::new(99);

        // When drawn
        let svg = render(&profile).unwrap();

        // Then it is a small SVG that says so
        let svg = text(&svg);
        assert!(svg.starts_with("<?xml"));
        assert!(svg.contains("<svg "));
        assert!(svg.contains(">no samples</text>"));
        assert!(svg.contains(">0 samples at 99 Hz</text>"));
        assert!(svg.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(START), "2023-11-14 22:13:20");
        // A leap day, and the last second of a year.
        assert_eq!(utc(951_782_400_000_000_000), "2000-02-29 00:00:00");
        assert_eq!(utc(1_735_689_599_999_999_999), "2024-12-31 23:59:59");
    }
}
