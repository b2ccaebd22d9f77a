//! ETag lists of the conditional headers (If-Match, If-None-Match): parsing
//! them and matching an object's ETag against them. HTTP syntax stays here;
//! the store is handed parsed lists (`store::PutCondition::IfMatch`).

/// The entity tags of an If-Match / If-None-Match value, in order, with
/// the weak prefix (`W/`) and quotes taken off; `*` stays `*`.
pub fn parse_list(list: &str) -> Vec<String> {
    list.split(',').map(|t| normalise(t).to_string()).collect()
}

/// Whether an If-Match / If-None-Match list names `etag` (or is `*`).
pub fn etag_list_matches(list: &str, etag: &str) -> bool {
    list.split(',')
        .map(normalise)
        .any(|t| t == "*" || t == etag)
}

fn normalise(tag: &str) -> &str {
    tag.trim().trim_start_matches("W/").trim_matches('"')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_match_as_parsed() {
        for (list, etag, want) in [
            ("\"abc\"", "abc", true),
            ("W/\"abc\"", "abc", true),
            (" \"x\" , \"abc\" ", "abc", true),
            ("*", "anything", true),
            ("\"abc\"", "abd", false),
            ("", "", true),
            ("\"\"", "abc", false),
        ] {
            assert_eq!(etag_list_matches(list, etag), want, "{list:?} {etag:?}");
            // What the store does with a parsed If-Match list.
            let parsed = parse_list(list).iter().any(|t| t == "*" || t == etag);
            assert_eq!(parsed, want, "{list:?} parsed");
        }
    }
}
