//! What a scraper's `Accept` and `Accept-Encoding` headers ask of `/metrics`: the format
//! (Prometheus protobuf, OpenMetrics text or the classic text) and whether to gzip it.
//!
//! Each media range or coding may carry a quality (`;q=0.5`); `q=0` refuses it. The format with
//! the highest quality wins, ties going to protobuf (its histograms are native), then
//! OpenMetrics, then the classic text, which is also the answer to a client that names none of
//! them (curl, `*/*`).

/// The format of a `/metrics` reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Format {
    /// Length-delimited `io.prometheus.client.MetricFamily` messages, native histograms.
    Protobuf,
    /// OpenMetrics text 1.0.0.
    OpenMetrics,
    /// The classic Prometheus text format 0.0.4.
    Classic,
}

/// The media type and parameters that name the protobuf format.
const PROTOBUF: &str = "application/vnd.google.protobuf";
const PROTOBUF_PROTO: &str = "io.prometheus.client.MetricFamily";

/// The quality of one `;`-separated element (`q=…`): 1 without one, 0 when malformed.
fn quality<'a>(params: impl Iterator<Item = &'a str>) -> f32 {
    for p in params {
        if let Some((k, v)) = p.split_once('=')
            && k.trim().eq_ignore_ascii_case("q")
        {
            return v.trim().parse::<f32>().ok().filter(|q| (0.0..=1.0).contains(q)).unwrap_or(0.0);
        }
    }
    1.0
}

/// The format an `Accept` header value asks for.
pub(crate) fn format(accept: &str) -> Format {
    let mut best: (f32, Format) = (0.0, Format::Classic);
    for range in accept.split(',') {
        let mut parts = range.split(';');
        let media = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
        let params: Vec<&str> = parts.collect();
        let q = quality(params.iter().copied());
        let format = match media.as_str() {
            PROTOBUF => {
                let param = |name: &str| {
                    params.iter().find_map(|p| {
                        let (k, v) = p.split_once('=')?;
                        k.trim().eq_ignore_ascii_case(name).then(|| v.trim().trim_matches('"'))
                    })
                };
                if param("proto") != Some(PROTOBUF_PROTO) || param("encoding") != Some("delimited") {
                    continue;
                }
                Format::Protobuf
            }
            "application/openmetrics-text" => Format::OpenMetrics,
            _ => continue,
        };
        let rank = |f: Format| match f {
            Format::Protobuf => 2,
            Format::OpenMetrics => 1,
            Format::Classic => 0,
        };
        if q > best.0 || (q == best.0 && q > 0.0 && rank(format) > rank(best.1)) {
            best = (q, format);
        }
    }
    best.1
}

/// Whether an `Accept-Encoding` header value accepts gzip (by name or `*`, with a quality above
/// 0, and not refused by name).
pub(crate) fn gzip(accept_encoding: &str) -> bool {
    let mut named = None;
    let mut any = None;
    for coding in accept_encoding.split(',') {
        let mut parts = coding.split(';');
        let name = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
        let q = quality(parts);
        match name.as_str() {
            "gzip" | "x-gzip" => named = Some(q > 0.0),
            "*" => any = Some(q > 0.0),
            _ => {}
        }
    }
    named.or(any).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scrapers_preference_chooses_the_format() {
        // Prometheus 2.42 with native histograms on, then without.
        let native = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;\
                      encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
        assert_eq!(format(native), Format::Protobuf);
        let classic = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                       version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(format(classic), Format::OpenMetrics);
        assert_eq!(format("*/*"), Format::Classic);
        assert_eq!(format(""), Format::Classic);
        // A refused or lesser protobuf, or one of another message, is not chosen.
        let refused = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;\
                       encoding=delimited;q=0,application/openmetrics-text";
        assert_eq!(format(refused), Format::OpenMetrics);
        let other = "application/vnd.google.protobuf;proto=other.Message;encoding=delimited";
        assert_eq!(format(other), Format::Classic);
        let text = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=text";
        assert_eq!(format(text), Format::Classic);
        let lesser = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;\
                      encoding=delimited;q=0.4,application/openmetrics-text;q=0.9";
        assert_eq!(format(lesser), Format::OpenMetrics);
    }

    #[test]
    fn gzip_is_used_when_accepted_and_not_refused() {
        assert!(gzip("gzip"));
        assert!(gzip("deflate, gzip;q=1.0, *;q=0.5"));
        assert!(gzip("*"));
        assert!(gzip("GZIP;q=0.1"));
        assert!(!gzip(""));
        assert!(!gzip("identity"));
        assert!(!gzip("gzip;q=0"));
        assert!(!gzip("gzip;q=0.0, *"));
        assert!(!gzip("*;q=0"));
        assert!(!gzip("br, deflate"));
        assert!(!gzip("gzip;q=nonsense"));
    }
}
