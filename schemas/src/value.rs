//! Small helpers to build and take apart `apache_avro::types::Value`s, so the conversions read as the
//! schemas do. Every reader names what it expected, so a shape error says where it happened.

use crate::error::{Error, Result};
use apache_avro::types::Value;
use pipelines::money::Money;
use pipelines::time::Timestamp;

/// Largest unscaled value of `decimal(18, 2)`: 10^18 − 1 paise.
const DECIMAL_18_MAX: i128 = 999_999_999_999_999_999;

pub(crate) fn string(text: &str) -> Value {
    Value::String(text.to_owned())
}

pub(crate) fn record(fields: Vec<(&'static str, Value)>) -> Value {
    Value::Record(fields.into_iter().map(|(name, value)| (name.to_owned(), value)).collect())
}

/// A `["null", T]` union with `null` first (every optional field of our schemas).
pub(crate) fn optional(value: Option<Value>) -> Value {
    match value {
        None => Value::Union(0, Box::new(Value::Null)),
        Some(value) => Value::Union(1, Box::new(value)),
    }
}

pub(crate) fn optional_string<Text: AsRef<str>>(text: &Option<Text>) -> Value {
    optional(text.as_ref().map(|text| string(text.as_ref())))
}

pub(crate) fn timestamp(time: Timestamp) -> Value {
    Value::TimestampMillis(time.millis())
}

pub(crate) fn optional_timestamp(time: Option<Timestamp>) -> Value {
    optional(time.map(timestamp))
}

/// A `u32` as an Avro `long` (an `int` could not carry the upper half).
pub(crate) fn long_u32(number: u32) -> Value {
    Value::Long(i64::from(number))
}

pub(crate) fn long_u64(number: u64, what: &str) -> Result<Value> {
    i64::try_from(number).map(Value::Long).map_err(|_| Error::OutOfRange(format!("{what} {number} exceeds a long")))
}

/// Money as `decimal(18, 2)`: the two's-complement big-endian bytes of its paise.
pub(crate) fn money(amount: Money) -> Result<Value> {
    let mut decimal = amount.decimal();
    decimal.rescale(2);
    let paise = decimal.mantissa();
    if !(-DECIMAL_18_MAX..=DECIMAL_18_MAX).contains(&paise) {
        return Err(Error::OutOfRange(format!("{amount} does not fit decimal(18, 2)")));
    }
    let bytes = paise.to_be_bytes();
    // The shortest two's-complement form: drop leading bytes that only repeat the sign.
    let mut start = 0;
    while start + 1 < bytes.len() {
        let (byte, next) = (bytes[start], bytes[start + 1]);
        let redundant = (byte == 0x00 && next & 0x80 == 0) || (byte == 0xFF && next & 0x80 != 0);
        if !redundant {
            break;
        }
        start += 1;
    }
    Ok(Value::Decimal(apache_avro::Decimal::from(&bytes[start..])))
}

pub(crate) fn optional_money(amount: Option<Money>) -> Result<Value> {
    Ok(optional(amount.map(money).transpose()?))
}

/// One branch of a union of named records: `names` lists the branches in schema order (a test checks
/// the order against the schema).
pub(crate) fn branch(names: &'static [&'static str], name: &str, value: Value) -> Result<Value> {
    let index = names
        .iter()
        .position(|known| *known == name)
        .ok_or_else(|| Error::shape(format!("`{name}` is not a branch of {names:?}")))?;
    let index = u32::try_from(index).map_err(|_| Error::OutOfRange("union index".to_string()))?;
    Ok(Value::Union(index, Box::new(value)))
}

/// Which branch of a union of named records a value is in, by its index in the reader's schema.
pub(crate) fn which(value: Value, names: &'static [&'static str], what: &str) -> Result<(&'static str, Value)> {
    match value {
        Value::Union(index, inner) => {
            let name = usize::try_from(index)
                .ok()
                .and_then(|index| names.get(index))
                .ok_or_else(|| Error::shape(format!("{what}: union branch {index} is not one of {names:?}")))?;
            Ok((name, *inner))
        }
        other => Err(Error::shape(format!("{what}: expected a union, got {}", kind(&other)))),
    }
}

/// A short name for a value's kind in error messages (values can be large).
pub(crate) fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Boolean(_) => "boolean",
        Value::Int(_) => "int",
        Value::Long(_) => "long",
        Value::String(_) => "string",
        Value::Bytes(_) => "bytes",
        Value::Enum(..) => "enum",
        Value::Union(..) => "union",
        Value::Array(_) => "array",
        Value::Record(_) => "record",
        Value::Decimal(_) => "decimal",
        Value::TimestampMillis(_) => "timestamp-millis",
        _ => "another type",
    }
}

/// An Avro enum mapped to a Rust enum. `symbol` is an exhaustive `match`, so a new Rust variant does not
/// compile until it has a symbol; a test checks the symbols against the schemas and serde's names.
pub(crate) trait Symbols: Sized + Copy + 'static {
    const SYMBOLS: &'static [&'static str];
    const ALL: &'static [Self];
    fn symbol(self) -> &'static str;
}

macro_rules! symbols {
    ($ty:ty { $($variant:path => $symbol:literal),+ $(,)? }) => {
        impl $crate::value::Symbols for $ty {
            const SYMBOLS: &'static [&'static str] = &[$($symbol),+];
            const ALL: &'static [$ty] = &[$($variant),+];
            fn symbol(self) -> &'static str {
                match self {
                    $($variant => $symbol),+
                }
            }
        }
    };
}
pub(crate) use symbols;

pub(crate) fn enumeration<E: Symbols>(value: E) -> Result<Value> {
    let symbol = value.symbol();
    let index = E::SYMBOLS
        .iter()
        .position(|known| *known == symbol)
        .and_then(|index| u32::try_from(index).ok())
        .ok_or_else(|| Error::shape(format!("symbol `{symbol}` missing from its list")))?;
    Ok(Value::Enum(index, symbol.to_owned()))
}

pub(crate) fn optional_enumeration<E: Symbols>(value: Option<E>) -> Result<Value> {
    Ok(optional(value.map(enumeration).transpose()?))
}

/// A name of a fixed list (`input_type`) as an Avro enum of that list.
pub(crate) fn static_name(name: &str, names: &'static [&'static str]) -> Result<Value> {
    let index = names
        .iter()
        .position(|known| *known == name)
        .and_then(|index| u32::try_from(index).ok())
        .ok_or_else(|| Error::shape(format!("`{name}` is not one of {names:?}")))?;
    Ok(Value::Enum(index, name.to_owned()))
}

/// The fields of a record, taken out one by one by name (the writer's order does not matter).
pub(crate) struct Fields {
    fields: Vec<(String, Value)>,
    what: &'static str,
}

impl Fields {
    pub(crate) fn of(value: Value, what: &'static str) -> Result<Fields> {
        match value {
            Value::Record(fields) => Ok(Fields { fields, what }),
            other => Err(Error::shape(format!("{what}: expected a record, got {}", kind(&other)))),
        }
    }

    pub(crate) fn take(&mut self, name: &str) -> Result<Value> {
        self.fields
            .iter_mut()
            .find(|(field, _)| field == name)
            .map(|(_, value)| std::mem::replace(value, Value::Null))
            .ok_or_else(|| Error::shape(format!("{}: no field `{name}`", self.what)))
    }

    fn error(&self, name: &str, expected: &str, got: &Value) -> Error {
        Error::shape(format!("{}.{name}: expected {expected}, got {}", self.what, kind(got)))
    }

    /// The value of a `["null", T]` field, `None` for null.
    pub(crate) fn optional(&mut self, name: &str) -> Result<Option<Value>> {
        Ok(match self.take(name)? {
            Value::Union(_, inner) => match *inner {
                Value::Null => None,
                inner => Some(inner),
            },
            Value::Null => None,
            other => Some(other),
        })
    }

    /// A string field, as whichever owned string type the event holds (`String` or the engine's `Text`).
    pub(crate) fn string<Text: From<String>>(&mut self, name: &str) -> Result<Text> {
        let value = self.take(name)?;
        self.as_string(name, value).map(Text::from)
    }

    fn as_string(&self, name: &str, value: Value) -> Result<String> {
        match value {
            Value::String(text) => Ok(text),
            other => Err(self.error(name, "a string", &other)),
        }
    }

    pub(crate) fn optional_string<Text: From<String>>(&mut self, name: &str) -> Result<Option<Text>> {
        self.optional(name)?.map(|value| self.as_string(name, value).map(Text::from)).transpose()
    }

    pub(crate) fn boolean(&mut self, name: &str) -> Result<bool> {
        match self.take(name)? {
            Value::Boolean(flag) => Ok(flag),
            other => Err(self.error(name, "a boolean", &other)),
        }
    }

    pub(crate) fn long(&mut self, name: &str) -> Result<i64> {
        let value = self.take(name)?;
        self.as_long(name, value)
    }

    fn as_long(&self, name: &str, value: Value) -> Result<i64> {
        match value {
            Value::Long(number) => Ok(number),
            Value::Int(number) => Ok(i64::from(number)),
            other => Err(self.error(name, "a long", &other)),
        }
    }

    pub(crate) fn u32(&mut self, name: &str) -> Result<u32> {
        let number = self.long(name)?;
        u32::try_from(number).map_err(|_| Error::OutOfRange(format!("{}.{name} = {number}", self.what)))
    }

    pub(crate) fn optional_u32(&mut self, name: &str) -> Result<Option<u32>> {
        match self.optional(name)? {
            None => Ok(None),
            Some(value) => {
                let number = self.as_long(name, value)?;
                u32::try_from(number)
                    .map(Some)
                    .map_err(|_| Error::OutOfRange(format!("{}.{name} = {number}", self.what)))
            }
        }
    }

    pub(crate) fn u64(&mut self, name: &str) -> Result<u64> {
        let number = self.long(name)?;
        u64::try_from(number).map_err(|_| Error::OutOfRange(format!("{}.{name} = {number}", self.what)))
    }

    pub(crate) fn timestamp(&mut self, name: &str) -> Result<Timestamp> {
        let value = self.take(name)?;
        self.as_timestamp(name, value)
    }

    fn as_timestamp(&self, name: &str, value: Value) -> Result<Timestamp> {
        match value {
            Value::TimestampMillis(millis) | Value::Long(millis) => Ok(Timestamp::from_millis(millis)),
            other => Err(self.error(name, "a timestamp-millis", &other)),
        }
    }

    pub(crate) fn optional_timestamp(&mut self, name: &str) -> Result<Option<Timestamp>> {
        self.optional(name)?.map(|value| self.as_timestamp(name, value)).transpose()
    }

    pub(crate) fn money(&mut self, name: &str) -> Result<Money> {
        let value = self.take(name)?;
        self.as_money(name, value)
    }

    fn as_money(&self, name: &str, value: Value) -> Result<Money> {
        let bytes = match value {
            Value::Decimal(decimal) => {
                <Vec<u8>>::try_from(&decimal).map_err(|error| Error::shape(format!("{}.{name}: {error}", self.what)))?
            }
            Value::Bytes(bytes) => bytes,
            other => return Err(self.error(name, "a decimal", &other)),
        };
        if bytes.is_empty() || bytes.len() > 16 {
            return Err(Error::OutOfRange(format!("{}.{name}: a decimal of {} bytes", self.what, bytes.len())));
        }
        let fill = if bytes[0] & 0x80 != 0 { 0xFF } else { 0x00 };
        let mut wide = [fill; 16];
        wide[16 - bytes.len()..].copy_from_slice(&bytes);
        let paise = i128::from_be_bytes(wide);
        if !(-DECIMAL_18_MAX..=DECIMAL_18_MAX).contains(&paise) {
            return Err(Error::OutOfRange(format!("{}.{name}: {paise} paise exceeds decimal(18, 2)", self.what)));
        }
        let paise = i64::try_from(paise).map_err(|_| Error::OutOfRange(format!("{}.{name}", self.what)))?;
        Ok(Money::from_paise(paise))
    }

    pub(crate) fn optional_money(&mut self, name: &str) -> Result<Option<Money>> {
        self.optional(name)?.map(|value| self.as_money(name, value)).transpose()
    }

    pub(crate) fn enumeration<E: Symbols>(&mut self, name: &str) -> Result<E> {
        let value = self.take(name)?;
        self.as_enumeration(name, value)
    }

    fn as_enumeration<E: Symbols>(&self, name: &str, value: Value) -> Result<E> {
        let symbol = match value {
            Value::Enum(_, symbol) | Value::String(symbol) => symbol,
            other => return Err(self.error(name, "an enum", &other)),
        };
        E::SYMBOLS
            .iter()
            .position(|known| *known == symbol)
            .and_then(|index| E::ALL.get(index).copied())
            .ok_or_else(|| Error::shape(format!("{}.{name}: unknown symbol `{symbol}`", self.what)))
    }

    pub(crate) fn optional_enumeration<E: Symbols>(&mut self, name: &str) -> Result<Option<E>> {
        self.optional(name)?.map(|value| self.as_enumeration(name, value)).transpose()
    }

    /// A name of a fixed list, back as the list's `&'static str`.
    pub(crate) fn static_name(&mut self, name: &str, names: &'static [&'static str]) -> Result<&'static str> {
        let symbol = match self.take(name)? {
            Value::Enum(_, symbol) | Value::String(symbol) => symbol,
            other => return Err(self.error(name, "an enum", &other)),
        };
        names
            .iter()
            .find(|known| **known == symbol)
            .copied()
            .ok_or_else(|| Error::shape(format!("{}.{name}: unknown symbol `{symbol}`", self.what)))
    }

    pub(crate) fn bytes_or_null(&mut self, name: &str) -> Result<Option<Vec<u8>>> {
        match self.optional(name)? {
            None => Ok(None),
            Some(Value::Bytes(bytes)) => Ok(Some(bytes)),
            Some(other) => Err(self.error(name, "bytes", &other)),
        }
    }

    pub(crate) fn array(&mut self, name: &str) -> Result<Vec<Value>> {
        match self.take(name)? {
            Value::Array(items) => Ok(items),
            other => Err(self.error(name, "an array", &other)),
        }
    }
}
