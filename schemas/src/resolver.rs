//! Schema ids: [`SchemaResolver`] gives the id of a (subject, schema), registering it if needed, and the
//! schema of an id. [`StaticResolver`] serves the embedded schemas under fixed ids with no network (tests,
//! a single-binary deployment); [`RegistryResolver`] talks to a Confluent Schema Registry over HTTP and
//! caches both directions in bounded caches.

use crate::catalog::{embedded, SchemaDef, SchemaName};
use crate::error::{Error, Result};
use apache_avro::Schema;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Where schema ids come from.
pub trait SchemaResolver: Send + Sync {
    /// The id of `schema` under `subject`, registering it if needed (a registry refuses a schema that
    /// is not compatible with the subject's earlier versions: [`Error::Incompatible`]).
    fn id_for(&self, subject: &str, schema: &SchemaDef) -> impl Future<Output = Result<u32>> + Send;

    /// The schema an id names ([`Error::UnknownSchemaId`] if none).
    fn schema_for(&self, id: u32) -> impl Future<Output = Result<Arc<Schema>>> + Send;
}

/// The embedded schemas under their fixed ids ([`SchemaName::static_id`]), plus any added with
/// [`StaticResolver::with_schema`] (an older version a test writes with). Any subject is accepted.
#[derive(Clone, Debug)]
pub struct StaticResolver {
    schemas: Vec<(u32, u64, String, Arc<Schema>)>,
}

impl StaticResolver {
    pub fn new() -> Result<StaticResolver> {
        let mut schemas = Vec::with_capacity(SchemaName::ALL.len());
        for name in SchemaName::ALL {
            let def = embedded(*name)?;
            schemas.push((name.static_id(), def.fingerprint(), def.text().to_owned(), Arc::new(def.schema().clone())));
        }
        Ok(StaticResolver { schemas })
    }

    /// Adds a schema under an id of the caller's choosing (an id already used is replaced).
    pub fn with_schema(mut self, id: u32, schema: &SchemaDef) -> StaticResolver {
        self.schemas.retain(|(known, ..)| *known != id);
        self.schemas.push((id, schema.fingerprint(), schema.text().to_owned(), Arc::new(schema.schema().clone())));
        self
    }

    fn id_of(&self, subject: &str, schema: &SchemaDef) -> Result<u32> {
        self.schemas
            .iter()
            .find(|(_, fingerprint, text, _)| *fingerprint == schema.fingerprint() && text == schema.text())
            .map(|(id, ..)| *id)
            .ok_or_else(|| Error::NotRegistered { subject: subject.to_owned() })
    }

    fn schema_of(&self, id: u32) -> Result<Arc<Schema>> {
        self.schemas
            .iter()
            .find(|(known, ..)| *known == id)
            .map(|(.., schema)| Arc::clone(schema))
            .ok_or(Error::UnknownSchemaId(id))
    }
}

impl SchemaResolver for StaticResolver {
    fn id_for(&self, subject: &str, schema: &SchemaDef) -> impl Future<Output = Result<u32>> + Send {
        std::future::ready(self.id_of(subject, schema))
    }

    fn schema_for(&self, id: u32) -> impl Future<Output = Result<Arc<Schema>>> + Send {
        std::future::ready(self.schema_of(id))
    }
}

/// Entries each cache of a [`RegistryResolver`] keeps by default.
pub const REGISTRY_CACHE_ENTRIES: usize = 1_024;
/// Time allowed for one registry request (connect included).
pub const REGISTRY_TIMEOUT: Duration = Duration::from_secs(5);

/// A cache that forgets its oldest entry when full (ids and schemas never change once assigned, so
/// nothing is ever stale; the bound only caps memory).
#[derive(Debug)]
struct Bounded<K, V> {
    entries: HashMap<K, V>,
    order: VecDeque<K>,
    capacity: usize,
}

impl<K: std::hash::Hash + Eq + Clone, V: Clone> Bounded<K, V> {
    fn new(capacity: usize) -> Bounded<K, V> {
        Bounded { entries: HashMap::new(), order: VecDeque::new(), capacity: capacity.max(1) }
    }

    fn get(&self, key: &K) -> Option<V> {
        self.entries.get(key).cloned()
    }

    fn insert(&mut self, key: K, value: V) {
        if self.entries.insert(key.clone(), value).is_none() {
            self.order.push_back(key);
        }
        while self.order.len() > self.capacity {
            if let Some(oldest) = self.order.pop_front() {
                self.entries.remove(&oldest);
            }
        }
    }

    fn len(&self) -> usize {
        self.entries.len()
    }
}

/// The id cache's key: subject and schema text fingerprints (no allocation per lookup); the entry keeps
/// the subject to rule out a collision of the combined hash.
type IdEntry = (String, u64, u32);

/// A Confluent Schema Registry client: `POST /subjects/{subject}/versions` to register (or find) a
/// schema's id, `GET /schemas/ids/{id}` to fetch a schema, `POST
/// /compatibility/subjects/{subject}/versions/latest` to ask before registering.
#[derive(Debug)]
pub struct RegistryResolver {
    client: reqwest::Client,
    base: reqwest::Url,
    ids: Mutex<Bounded<u64, IdEntry>>,
    schemas: Mutex<Bounded<u32, Arc<Schema>>>,
}

#[derive(Serialize)]
struct SchemaRequest<'a> {
    schema: &'a str,
}

#[derive(Deserialize)]
struct IdAnswer {
    id: u32,
}

#[derive(Deserialize)]
struct SchemaAnswer {
    schema: String,
}

#[derive(Deserialize)]
struct CompatibilityAnswer {
    is_compatible: bool,
}

#[derive(Deserialize, Default)]
struct ErrorAnswer {
    #[serde(default)]
    error_code: i64,
    #[serde(default)]
    message: String,
}

/// The Schema Registry's media type.
const MEDIA_TYPE: &str = "application/vnd.schemaregistry.v1+json";

impl RegistryResolver {
    /// A client of the registry at `base_url` (e.g. `http://localhost:8081`).
    pub fn new(base_url: &str) -> Result<RegistryResolver> {
        RegistryResolver::with_options(base_url, REGISTRY_CACHE_ENTRIES, REGISTRY_TIMEOUT)
    }

    pub fn with_options(base_url: &str, cache_entries: usize, timeout: Duration) -> Result<RegistryResolver> {
        let base = reqwest::Url::parse(base_url)
            .map_err(|error| Error::RegistryProtocol(format!("bad registry URL `{base_url}`: {error}")))?;
        if base.cannot_be_a_base() {
            return Err(Error::RegistryProtocol(format!("bad registry URL `{base_url}`")));
        }
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .build()
            .map_err(|error| Error::RegistryUnreachable(error.to_string()))?;
        Ok(RegistryResolver {
            client,
            base,
            ids: Mutex::new(Bounded::new(cache_entries)),
            schemas: Mutex::new(Bounded::new(cache_entries)),
        })
    }

    /// Entries in the (id, schema) caches, for tests and metrics.
    pub fn cached(&self) -> (usize, usize) {
        let ids = self.ids.lock().map(|cache| cache.len()).unwrap_or(0);
        let schemas = self.schemas.lock().map(|cache| cache.len()).unwrap_or(0);
        (ids, schemas)
    }

    fn url(&self, segments: &[&str]) -> Result<reqwest::Url> {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .map_err(|()| Error::RegistryProtocol(format!("bad registry URL `{}`", self.base)))?
            .pop_if_empty()
            .extend(segments);
        Ok(url)
    }

    /// Registers `schema` under `subject` (the registry answers the existing id if it has it).
    pub async fn register(&self, subject: &str, schema: &SchemaDef) -> Result<u32> {
        let url = self.url(&["subjects", subject, "versions"])?;
        let request = self.client.post(url).header(reqwest::header::CONTENT_TYPE, MEDIA_TYPE);
        let body = serde_json::to_vec(&SchemaRequest { schema: schema.text() })
            .map_err(|error| Error::RegistryProtocol(error.to_string()))?;
        let answer: IdAnswer = send(request.body(body), subject, None).await?;
        Ok(answer.id)
    }

    /// Whether `schema` may be registered under `subject` (checked against its latest version under
    /// the subject's compatibility level). A subject with no version yet is compatible.
    pub async fn is_compatible(&self, subject: &str, schema: &SchemaDef) -> Result<bool> {
        let url = self.url(&["compatibility", "subjects", subject, "versions", "latest"])?;
        let request = self.client.post(url).header(reqwest::header::CONTENT_TYPE, MEDIA_TYPE);
        let body = serde_json::to_vec(&SchemaRequest { schema: schema.text() })
            .map_err(|error| Error::RegistryProtocol(error.to_string()))?;
        match send::<CompatibilityAnswer>(request.body(body), subject, None).await {
            Ok(answer) => Ok(answer.is_compatible),
            // 40401: subject not found, 40402: version not found: nothing to be incompatible with.
            Err(Error::RegistryRefused { status: 404, .. }) => Ok(true),
            Err(error) => Err(error),
        }
    }

    /// Fetches the schema of `id`, uncached.
    pub async fn fetch(&self, id: u32) -> Result<Schema> {
        let url = self.url(&["schemas", "ids", &id.to_string()])?;
        let answer: SchemaAnswer = send(self.client.get(url), "", Some(id)).await?;
        Schema::parse_str(&answer.schema).map_err(|error| Error::InvalidSchema(format!("schema {id}: {error}")))
    }
}

fn id_key(subject: &str, schema: &SchemaDef) -> u64 {
    let subject_hash = subject
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3));
    subject_hash ^ schema.fingerprint().rotate_left(29)
}

/// Sends a request and reads its JSON answer, sorting failures into retryable and fatal.
async fn send<T: serde::de::DeserializeOwned>(
    request: reqwest::RequestBuilder,
    subject: &str,
    schema_id: Option<u32>,
) -> Result<T> {
    let response = request.send().await.map_err(|error| Error::RegistryUnreachable(error.to_string()))?;
    let status = response.status();
    let bytes = response.bytes().await.map_err(|error| Error::RegistryUnreachable(error.to_string()))?;
    if status.is_success() {
        return serde_json::from_slice(&bytes)
            .map_err(|error| Error::RegistryProtocol(format!("{error}: {}", String::from_utf8_lossy(&bytes))));
    }
    let ErrorAnswer { error_code, message } = serde_json::from_slice(&bytes).unwrap_or_default();
    let status = status.as_u16();
    Err(match (status, schema_id) {
        (500..=599, _) => Error::RegistryUnavailable { status, message },
        (404, Some(id)) => Error::UnknownSchemaId(id),
        (409, _) => Error::Incompatible { subject: subject.to_owned(), message },
        (422, _) => Error::InvalidSchema(format!("refused by the registry ({error_code}): {message}")),
        _ => Error::RegistryRefused { status, code: error_code, message },
    })
}

impl SchemaResolver for RegistryResolver {
    async fn id_for(&self, subject: &str, schema: &SchemaDef) -> Result<u32> {
        let key = id_key(subject, schema);
        let cached = self.ids.lock().ok().and_then(|cache| {
            cache
                .entries
                .get(&key)
                .filter(|(known, fingerprint, _)| known == subject && *fingerprint == schema.fingerprint())
                .map(|(.., id)| *id)
        });
        if let Some(id) = cached {
            return Ok(id);
        }
        let id = self.register(subject, schema).await?;
        if let Ok(mut cache) = self.ids.lock() {
            cache.insert(key, (subject.to_owned(), schema.fingerprint(), id));
        }
        Ok(id)
    }

    async fn schema_for(&self, id: u32) -> Result<Arc<Schema>> {
        if let Some(schema) = self.schemas.lock().ok().and_then(|cache| cache.get(&id)) {
            return Ok(schema);
        }
        let schema = Arc::new(self.fetch(id).await?);
        if let Ok(mut cache) = self.schemas.lock() {
            cache.insert(id, Arc::clone(&schema));
        }
        Ok(schema)
    }
}
