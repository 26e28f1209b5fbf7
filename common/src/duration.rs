//! Durations on the command line and in the relay's config file: `500ms`, `5s`, `2m`, `1h`.

use std::time::Duration;

/// Shortest duration accepted.
const MIN_SECS: f64 = 0.01;
/// Longest duration accepted: one day. The sampler always capped its interval here; the relay
/// allowed 31 days, which no window, recording or timeout needs (the stricter bound is kept).
const MAX_SECS: f64 = 86_400.0;

/// Parses `5s`, `500ms`, `2m`, `1h` (a bare number is seconds), from 10ms to 24h.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (value, unit) = number_and_unit(text, "5s, 500ms or 2m")?;
    let secs = match unit {
        "ms" => value / 1000.0,
        "s" | "" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => {
            return Err(format!(
                "unknown unit `{unit}` in `{text}`; use ms, s, m or h"
            ))
        }
    };
    if !(MIN_SECS..=MAX_SECS).contains(&secs) {
        return Err(format!("`{text}` is out of range (10ms to 24h)"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Longest `--off-cpu-min`: the kernel's keep test multiplies it by a 32-bit random number.
pub const MAX_OFF_CPU_MIN: Duration = Duration::from_secs(1);

/// Parses `--off-cpu-min`: `1ms`, `200us`, `50000ns`, `0.5ms`, from 0 to 1s (a bare number is
/// milliseconds).
pub fn parse_off_cpu_min(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (value, unit) = number_and_unit(text, "1ms, 200us or 0.5ms")?;
    let nanos = match unit {
        "ns" => value,
        "us" | "µs" => value * 1e3,
        "ms" | "" => value * 1e6,
        "s" => value * 1e9,
        _ => {
            return Err(format!(
                "unknown unit `{unit}` in `{text}`; use ns, us, ms or s"
            ))
        }
    };
    if !(0.0..=1e9).contains(&nanos) {
        return Err(format!("`{text}` is out of range (0 to 1s)"));
    }
    Ok(Duration::from_nanos(nanos as u64))
}

/// Splits `1.5ms` into its number and its unit (`ms`; empty for a bare number); `examples`
/// names valid durations in the error.
fn number_and_unit<'a>(text: &'a str, examples: &str) -> Result<(f64, &'a str), String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration like {examples}"))?;
    Ok((value, unit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_bounds() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration(" 10 "), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("10ms"), Ok(Duration::from_millis(10)));
        for bad in ["ten", "5x", "3d", "0s", "9ms", "25h", ""] {
            assert!(parse_duration(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(parse_duration("5x")
            .unwrap_err()
            .contains("unknown unit `x`"));
        assert!(parse_duration("25h")
            .unwrap_err()
            .contains("out of range (10ms to 24h)"));
    }
}
