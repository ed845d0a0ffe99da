//! Shape checks for strings that come from kubelet or from a ResourceClaim and end up in a
//! file name, a directory name, an API path or a process's input. Each accepts only a small
//! ASCII alphabet, so nothing that passes can hold a `/`, a `..` path component, whitespace,
//! a NUL or any other control character.

/// A Kubernetes UID in RFC 4122 textual form: `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, hex
/// digits (the API server generates them so).
pub fn is_uid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, len)| g.len() == len && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A DNS-1123 label (namespace names, request and device names): at most 63 characters of
/// `a-z`, `0-9` and `-`, starting and ending with a letter or digit.
pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 subdomain (most object names): at most 253 characters, DNS-1123 labels joined
/// by single dots.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_are_rfc_4122_text() {
        assert!(is_uid("0b6fd0a2-3c1e-4f5a-9d2b-7e8f9a0b1c2d"));
        assert!(is_uid("0B6FD0A2-3C1E-4F5A-9D2B-7E8F9A0B1C2D"));
        for bad in [
            "",
            "u1",
            "../../etc",
            "0b6fd0a2-3c1e-4f5a-9d2b-7e8f9a0b1c2",
            "0b6fd0a2-3c1e-4f5a-9d2b-7e8f9a0b1c2d0",
            "0b6fd0a2-3c1e-4f5a-9d2b-7e8f9a0b1c2g",
            "0b6fd0a2-3c1e-4f5a-9d2b-7e8f9a0b1c/d",
            "0b6fd0a2-3c1e-4f5a-9d2b-7e8f9a0b1c\nd",
            "0b6fd0a23c1e-4f5a-9d2b-7e8f9a0b1c2d-",
        ] {
            assert!(!is_uid(bad), "{bad:?}");
        }
    }

    #[test]
    fn labels_and_subdomains_follow_dns_1123() {
        assert!(is_dns1123_label("gpu-0"));
        assert!(is_dns1123_label(&"a".repeat(63)));
        assert!(is_dns1123_subdomain("my-claim.v2"));
        for bad in [
            "",
            "-a",
            "a-",
            "A",
            "a_b",
            "a/b",
            "..",
            "a\nb",
            "a\0",
            &"a".repeat(64),
        ] {
            assert!(!is_dns1123_label(bad), "{bad:?}");
        }
        for bad in ["", ".", "..", "a..b", ".a", "a.", "../etc", "a/b", "a b"] {
            assert!(!is_dns1123_subdomain(bad), "{bad:?}");
        }
        assert!(!is_dns1123_subdomain(&["a"; 128].join(".")));
    }
}
