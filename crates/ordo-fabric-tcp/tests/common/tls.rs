//! A throwaway CA and member certificates (IP SAN 127.0.0.1), made with rcgen.

use ordo_fabric_tcp::TlsSettings;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A CA that signs member certificates.
pub struct Pki {
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl Pki {
    pub fn new() -> Pki {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, "ordo test CA");
        let ca = params.self_signed(&ca_key).unwrap();
        Pki { ca, ca_key }
    }

    /// A member's settings: a fresh certificate for 127.0.0.1 signed by this CA.
    pub fn member(&self) -> TlsSettings {
        let (chain, key) = self.certificate(&["127.0.0.1"]);
        TlsSettings::from_der(chain, key, vec![self.ca_der()]).unwrap()
    }

    /// A certificate for `names` signed by this CA, and its key.
    pub fn certificate(&self, names: &[&str]) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let params =
            rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        let cert = params.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        (vec![cert.der().clone()], PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())))
    }

    pub fn ca_der(&self) -> CertificateDer<'static> {
        self.ca.der().clone()
    }

    /// PEM texts: (certificate, key, CA), for file-based configuration.
    pub fn member_pem(&self) -> (String, String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        let cert = params.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        (cert.pem(), key.serialize_pem(), self.ca.pem())
    }
}
