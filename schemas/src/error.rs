//! One error type for the crate. [`Error::is_retryable`] separates what may succeed if tried again (the
//! registry unreachable or failing, 5xx) from what never will with the same bytes or schema (bad framing,
//! a body that does not match its schema, an incompatible schema): a consumer retries the first and
//! dead-letters the second.

/// Everything this crate refuses.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The first byte of a Confluent-framed message is not 0.
    #[error("bad magic byte {0:#04x}: Confluent wire format starts with 0")]
    BadMagic(u8),
    /// Fewer than the 5 header bytes.
    #[error("truncated message: {0} bytes, the Confluent header alone has 5")]
    Truncated(usize),
    /// The resolver knows no schema by this id.
    #[error("unknown schema id {0}")]
    UnknownSchemaId(u32),
    /// The body could not be read with the writer schema its id names (or resolved to the reader's).
    #[error("the body does not match schema {id}: {reason}")]
    BodyMismatch { id: u32, reason: String },
    /// A value could not be written with its schema (a conversion bug or an out-of-range value).
    #[error("cannot encode with schema `{schema}`: {reason}")]
    Encode { schema: &'static str, reason: String },
    /// An Avro value that decoded fine does not fit the Rust type (wrong shape, unknown symbol).
    #[error("{0}")]
    Shape(String),
    /// A number or amount outside what the schema or the Rust type can carry.
    #[error("out of range: {0}")]
    OutOfRange(String),
    /// A schema text that does not parse.
    #[error("invalid schema: {0}")]
    InvalidSchema(String),
    /// A resolver that cannot register schemas was asked for the id of one it does not hold.
    #[error("no schema id for this schema under subject `{subject}`")]
    NotRegistered { subject: String },
    /// A value of one schema offered for a topic whose subject uses another.
    #[error("topic `{topic}` carries `{expected}`, not `{got}`")]
    WrongTopic { topic: &'static str, expected: &'static str, got: &'static str },
    /// The registry refused a schema as incompatible with the subject's earlier versions.
    #[error("schema for subject `{subject}` refused as incompatible: {message}")]
    Incompatible { subject: String, message: String },
    /// The registry could not be reached, or timed out (retryable).
    #[error("schema registry unreachable: {0}")]
    RegistryUnreachable(String),
    /// The registry answered 5xx (retryable).
    #[error("schema registry failed with {status}: {message}")]
    RegistryUnavailable { status: u16, message: String },
    /// The registry refused the request with a 4xx other than a known case (fatal).
    #[error("schema registry refused with {status} (error code {code}): {message}")]
    RegistryRefused { status: u16, code: i64, message: String },
    /// The registry's answer is not what its API documents (fatal).
    #[error("unexpected schema registry answer: {0}")]
    RegistryProtocol(String),
}

impl Error {
    /// Whether trying the same operation again may succeed: only the registry's availability is
    /// transient; bad bytes, shapes and incompatible schemas stay bad.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::RegistryUnreachable(_) | Error::RegistryUnavailable { .. })
    }

    pub(crate) fn shape(what: impl Into<String>) -> Error {
        Error::Shape(what.into())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
