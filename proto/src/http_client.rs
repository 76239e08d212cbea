//! The HTTP client every fleetmend component that calls out over HTTP(S) starts from: the agent
//! reporting to the repairer, the CLI calling the repairer's admin API, the repairer calling a
//! BMC's Redfish API. Each adds its own timeouts and user agent to the builder this returns.
//!
//! Here, not in the repairer, so that the agent can use it without linking the repairer; behind
//! the `http-client` feature, so that crates that speak the wire types without HTTP (the runtime)
//! do not link reqwest.

use std::path::{Path, PathBuf};

/// Which certificate authorities a client trusts for `https://`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Roots<'a> {
    /// The system's roots.
    System,
    /// Only the certificates of this PEM bundle: a private CA, as the repairer's own TLS is.
    Only(&'a Path),
    /// The system's roots and the certificates of this PEM bundle (a BMC vendor's CA beside them).
    SystemAnd(&'a Path),
}

/// A CA bundle could not be read into a client's roots.
#[derive(Debug, thiserror::Error)]
pub enum CaFileError {
    #[error("reading the CA file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("parsing the CA file {path}: {source}")]
    Parse { path: PathBuf, source: reqwest::Error },
    /// A bundle with no PEM certificate in it (a DER file, a key): trusting it would trust
    /// nothing, or nothing more, and the handshakes would fail later with a vaguer error.
    #[error("the CA file {path} holds no certificate")]
    Empty { path: PathBuf },
}

/// A client builder that trusts `roots`, with rustls' ring provider installed (reqwest is built
/// without a bundled one).
pub fn builder(roots: Roots<'_>) -> Result<reqwest::ClientBuilder, CaFileError> {
    let builder = system_roots();
    Ok(match roots {
        Roots::System => builder,
        Roots::Only(path) => builder.tls_certs_only(read_bundle(path)?),
        Roots::SystemAnd(path) => builder.tls_certs_merge(read_bundle(path)?),
    })
}

/// A client builder that trusts the system's roots ([`Roots::System`], which cannot fail), with
/// rustls' ring provider installed.
pub fn system_roots() -> reqwest::ClientBuilder {
    // Installing twice fails harmlessly when another component of the process did it first.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
}

/// The certificates of the PEM bundle at `path`; at least one.
pub fn read_bundle(path: &Path) -> Result<Vec<reqwest::Certificate>, CaFileError> {
    let pem = std::fs::read(path)
        .map_err(|source| CaFileError::Read { path: path.to_owned(), source })?;
    let certificates = reqwest::Certificate::from_pem_bundle(&pem)
        .map_err(|source| CaFileError::Parse { path: path.to_owned(), source })?;
    if certificates.is_empty() {
        return Err(CaFileError::Empty { path: path.to_owned() });
    }
    Ok(certificates)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed CA certificate (`openssl req -x509`, P-256, valid until 2126).
    const CA_PEM: &str = "\
-----BEGIN CERTIFICATE-----
MIIBjjCCATWgAwIBAgIUWkLi/bPCFWT5ensDEbOjcOkVUG8wCgYIKoZIzj0EAwIw
HDEaMBgGA1UEAwwRZmxlZXRtZW5kIHRlc3QgQ0EwIBcNMjYxMjA3MTQyNjU3WhgP
MjEyNjExMTMxNDI2NTdaMBwxGjAYBgNVBAMMEWZsZWV0bWVuZCB0ZXN0IENBMFkw
EwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEyO5Y674hVZBw4PjAfyy7/DCgiCwP7cB1
sfaHe7rrd21O4w7Ow8LswLTlsWYAlx7eOHt3u5JNSufVMQjslB+YRqNTMFEwHQYD
VR0OBBYEFE1zdFComUw3rbyb69j/IZGvDuTSMB8GA1UdIwQYMBaAFE1zdFComUw3
rbyb69j/IZGvDuTSMA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDRwAwRAIg
Arzw0XQx1JWBqRTAf9nVYSKg2jzT4skg7H5h0guUsAoCIAOyOE7uYvFwqrMnvyWK
WIpuFCHFlzh54vfjY7Ci3dtY
-----END CERTIFICATE-----
";

    #[test]
    fn a_bundle_is_trusted_alone_or_beside_the_system_roots() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        // Two certificates: a bundle, not just one.
        std::fs::write(&path, format!("{CA_PEM}{CA_PEM}")).unwrap();
        assert_eq!(read_bundle(&path).unwrap().len(), 2);
        for roots in [Roots::System, Roots::Only(&path), Roots::SystemAnd(&path)] {
            let client = builder(roots).unwrap().build();
            assert!(client.is_ok(), "{roots:?}: {client:?}");
        }
    }

    #[test]
    fn a_missing_file_is_a_read_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent.pem");
        let err = builder(Roots::Only(&path)).unwrap_err();
        assert!(matches!(err, CaFileError::Read { .. }), "{err}");
        assert!(err.to_string().contains("absent.pem"), "{err}");
    }

    #[test]
    fn a_file_without_a_certificate_is_refused_either_way() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key.pem");
        std::fs::write(&path, "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
            .unwrap();
        for roots in [Roots::Only(&path), Roots::SystemAnd(&path)] {
            let err = builder(roots).unwrap_err();
            assert!(matches!(err, CaFileError::Empty { .. }), "{roots:?}: {err}");
            assert!(err.to_string().contains("key.pem holds no certificate"), "{err}");
        }
    }
}
