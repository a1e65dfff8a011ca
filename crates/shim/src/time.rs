//! Clocks and RFC 3339 timestamps, without a date library.

/// Length of a timestamp written by [`format_rfc3339_nano`]:
/// `YYYY-MM-DDTHH:MM:SS.nnnnnnnnnZ`.
pub const TIMESTAMP_LEN: usize = 30;

const NS_PER_SEC: i64 = 1_000_000_000;
const SECS_PER_DAY: i64 = 86_400;

fn clock_ns(clock: libc::clockid_t) -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own; the clocks used
    // here always exist on Linux, so it cannot fail.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec * NS_PER_SEC + ts.tv_nsec
}

/// Wall-clock time in nanoseconds since the Unix epoch.
pub fn realtime_ns() -> i64 {
    clock_ns(libc::CLOCK_REALTIME)
}

/// Monotonic time in nanoseconds, for deadlines.
pub fn monotonic_ns() -> i64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// Converts a day count since 1970-01-01 into a (year, month, day) date of the
/// proleptic Gregorian calendar.
///
/// The computation counts years from March, so that the leap day is the last
/// day of a year and every month length but February's follows a fixed
/// 5-month pattern (31 30 31 30 31); 400 Gregorian years are exactly 146097
/// days.
fn civil_date(days_since_epoch: i64) -> (i64, u32, u32) {
    // 1970-01-01 is day 719468 counted from 0000-03-01.
    let days = days_since_epoch + 719_468;
    let cycle = days.div_euclid(146_097);
    let day_of_cycle = days.rem_euclid(146_097); // 0..=146096
                                                 // Years into the cycle: remove the leap days gained every 4 years, given
                                                 // back every 100 and taken again at the cycle's last day.
    let year_of_cycle = (day_of_cycle - day_of_cycle / 1_460 + day_of_cycle / 36_524
        - day_of_cycle / 146_096)
        / 365; // 0..=399
    let day_of_year =
        day_of_cycle - (365 * year_of_cycle + year_of_cycle / 4 - year_of_cycle / 100); // 0..=365
    let month_from_march = (5 * day_of_year + 2) / 153; // 0..=11
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = cycle * 400 + year_of_cycle + i64::from(month <= 2);
    // Both are small and positive by construction.
    (year, month as u32, day as u32)
}

fn put_digits(out: &mut [u8], mut value: u64) {
    for slot in out.iter_mut().rev() {
        *slot = b'0' + (value % 10) as u8;
        value /= 10;
    }
}

/// Formats nanoseconds since the epoch as RFC 3339 in UTC with nine fraction
/// digits, e.g. `2026-11-22T01:02:03.123456789Z`. Years outside 0..=9999 are
/// clamped to that range's digits (they cannot occur on a running system).
pub fn format_rfc3339_nano(ns: i64, out: &mut [u8; TIMESTAMP_LEN]) {
    let secs = ns.div_euclid(NS_PER_SEC);
    let nanos = ns.rem_euclid(NS_PER_SEC) as u64;
    let (year, month, day) = civil_date(secs.div_euclid(SECS_PER_DAY));
    let sec_of_day = secs.rem_euclid(SECS_PER_DAY) as u64;
    let year = year.clamp(0, 9999) as u64;

    put_digits(&mut out[0..4], year);
    out[4] = b'-';
    put_digits(&mut out[5..7], u64::from(month));
    out[7] = b'-';
    put_digits(&mut out[8..10], u64::from(day));
    out[10] = b'T';
    put_digits(&mut out[11..13], sec_of_day / 3600);
    out[13] = b':';
    put_digits(&mut out[14..16], sec_of_day / 60 % 60);
    out[16] = b':';
    put_digits(&mut out[17..19], sec_of_day % 60);
    out[19] = b'.';
    put_digits(&mut out[20..29], nanos);
    out[29] = b'Z';
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fmt(ns: i64) -> String {
        let mut buf = [0u8; TIMESTAMP_LEN];
        format_rfc3339_nano(ns, &mut buf);
        String::from_utf8(buf.to_vec()).expect("timestamps are ASCII")
    }

    #[test]
    fn format_should_write_the_epoch() {
        assert_eq!(fmt(0), "1970-01-01T00:00:00.000000000Z");
    }

    #[test]
    fn format_should_keep_all_nine_fraction_digits() {
        assert_eq!(fmt(1), "1970-01-01T00:00:00.000000001Z");
        assert_eq!(
            fmt(1_700_000_000_123_456_789),
            "2023-11-14T22:13:20.123456789Z"
        );
        assert_eq!(fmt(999_999_999), "1970-01-01T00:00:00.999999999Z");
    }

    #[test]
    fn format_should_handle_leap_days() {
        const S: i64 = NS_PER_SEC;
        // 2000 is a leap year (divisible by 400).
        assert_eq!(fmt(951_782_400 * S), "2000-02-29T00:00:00.000000000Z");
        assert_eq!(fmt(951_868_800 * S), "2000-03-01T00:00:00.000000000Z");
        assert_eq!(fmt(1_709_164_800 * S), "2024-02-29T00:00:00.000000000Z");
        // 1972 is the first leap year after the epoch.
        assert_eq!(fmt(68_256_000 * S), "1972-03-01T00:00:00.000000000Z");
        // 2100 is not a leap year: Feb 28 is followed by Mar 1.
        assert_eq!(fmt(4_107_542_399 * S), "2100-02-28T23:59:59.000000000Z");
        assert_eq!(fmt(4_107_542_400 * S), "2100-03-01T00:00:00.000000000Z");
    }

    #[test]
    fn format_should_handle_year_ends() {
        const S: i64 = NS_PER_SEC;
        assert_eq!(fmt(946_684_799 * S), "1999-12-31T23:59:59.000000000Z");
        assert_eq!(fmt(946_684_800 * S), "2000-01-01T00:00:00.000000000Z");
        // The last instant an i64 of nanoseconds can hold.
        assert_eq!(fmt(i64::MAX), "2262-04-11T23:47:16.854775807Z");
        // Before the epoch the fraction still counts forward.
        assert_eq!(fmt(-1), "1969-12-31T23:59:59.999999999Z");
    }

    #[test]
    fn civil_date_should_agree_with_day_by_day_counting() {
        // Walk 1970..2500 one day at a time and compare with a naive calendar.
        let leap = |y: i64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        let (mut y, mut m, mut d) = (1970i64, 1u32, 1u32);
        for days in 0..(530 * 366) {
            assert_eq!(civil_date(days), (y, m, d), "day {days}");
            let month_len = match m {
                2 if leap(y) => 29,
                2 => 28,
                4 | 6 | 9 | 11 => 30,
                _ => 31,
            };
            d += 1;
            if d > month_len {
                d = 1;
                m += 1;
                if m > 12 {
                    m = 1;
                    y += 1;
                }
            }
        }
    }

    #[test]
    fn clocks_should_move_forward() {
        let a = monotonic_ns();
        let b = monotonic_ns();
        assert!(b >= a);
        // Any time after 2020 and before 2200.
        let now = realtime_ns();
        assert!(now > 1_577_836_800 * NS_PER_SEC && now < 7_258_118_400 * NS_PER_SEC);
    }
}
