//! IMF-fixdate (RFC 9110 5.6.7) without a date crate.

use std::time::{SystemTime, UNIX_EPOCH};

pub(crate) const IMF_FIXDATE_BYTES: usize = 29;

const WEEKDAYS: [&[u8; 3]; 7] = [b"Thu", b"Fri", b"Sat", b"Sun", b"Mon", b"Tue", b"Wed"];
const MONTHS: [&[u8; 3]; 12] = [
    b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec",
];

/// `Sun, 06 Nov 1994 08:49:37 GMT` for seconds since the Unix epoch.
pub fn imf_fixdate(unix_secs: u64) -> [u8; IMF_FIXDATE_BYTES] {
    let days = unix_secs / 86_400;
    let secs_of_day = unix_secs % 86_400;
    let (year, month, day) = civil_from_days(days as i64);
    let (year, month, day) = (year as u64, month as u64, day as u64);
    let mut out = *b"Thu, 01 Jan 1970 00:00:00 GMT";
    // 1970-01-01 was a Thursday, index 0 of WEEKDAYS.
    out[0..3].copy_from_slice(WEEKDAYS[(days % 7) as usize]);
    put_2_digits(&mut out[5..7], day);
    out[8..11].copy_from_slice(MONTHS[(month - 1) as usize]);
    // Years past 9999 cannot be written in this format; SystemTime will not
    // get there, and wrapping keeps the output well-formed.
    put_2_digits(&mut out[12..14], (year / 100) % 100);
    put_2_digits(&mut out[14..16], year % 100);
    put_2_digits(&mut out[17..19], secs_of_day / 3600);
    put_2_digits(&mut out[20..22], (secs_of_day / 60) % 60);
    put_2_digits(&mut out[23..25], secs_of_day % 60);
    out
}

fn put_2_digits(out: &mut [u8], value: u64) {
    debug_assert!(value < 100 && out.len() == 2);
    out[0] = b'0' + ((value / 10) % 10) as u8;
    out[1] = b'0' + (value % 10) as u8;
}

/// (year, month 1..=12, day 1..=31) for days since 1970-01-01, after
/// Howard Hinnant's `civil_from_days` (proleptic Gregorian). The one copy in
/// the server: HTTP dates, S3 XML dates and SigV4 dates all use it.
pub(crate) fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    debug_assert!((1..=12).contains(&month) && (1..=31).contains(&day));
    (year, month, day)
}

/// Formats the date at most once per second per connection.
#[derive(Debug, Default)]
pub(crate) struct DateCache {
    unix_secs: u64,
    text: Option<[u8; IMF_FIXDATE_BYTES]>,
}

impl DateCache {
    pub(crate) fn now(&mut self) -> &[u8; IMF_FIXDATE_BYTES] {
        // A clock before 1970 is a broken host; report the epoch.
        let unix_secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if self.text.is_none() || self.unix_secs != unix_secs {
            self.unix_secs = unix_secs;
            self.text = Some(imf_fixdate(unix_secs));
        }
        self.text.get_or_insert_with(|| imf_fixdate(unix_secs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        let cases: &[(u64, &str)] = &[
            (0, "Thu, 01 Jan 1970 00:00:00 GMT"),
            (784_111_777, "Sun, 06 Nov 1994 08:49:37 GMT"),
            (951_782_400, "Tue, 29 Feb 2000 00:00:00 GMT"),
            (4_102_444_800, "Fri, 01 Jan 2100 00:00:00 GMT"),
            (253_402_300_799, "Fri, 31 Dec 9999 23:59:59 GMT"),
        ];
        for (unix_secs, text) in cases {
            assert_eq!(
                std::str::from_utf8(&imf_fixdate(*unix_secs)).unwrap(),
                *text
            );
        }
    }

    #[test]
    fn cache_returns_current_date() {
        let mut cache = DateCache::default();
        let text = *cache.now();
        assert!(text.ends_with(b" GMT"));
        assert!(text[12..16] >= b"2024"[..]);
    }
}
