//! Avro schema resolution (reading data written with an older schema through the current one), done
//! here rather than by `apache_avro::types::Value::resolve`: apache-avro 0.21 picks the *first* branch
//! of a reader union that the value can be resolved to, ignoring the writer branch's name, so a
//! `collection_created` resolves to `merchant_deposit` (whose fields it has). The Avro specification
//! matches union branches by name for named types; this module does so, and fills fields the writer did
//! not have from the reader's defaults.

use apache_avro::schema::{Schema, SchemaKind, UnionSchema};
use apache_avro::types::Value;
use serde_json::Value as Json;
use std::collections::HashMap;

/// The named types of a schema by full name (to follow `Schema::Ref`s).
struct Names<'s>(HashMap<String, &'s Schema>);

impl<'s> Names<'s> {
    fn of(schema: &'s Schema) -> Names<'s> {
        let mut names = Names(HashMap::new());
        names.collect(schema);
        names
    }

    fn collect(&mut self, schema: &'s Schema) {
        if let Schema::Ref { .. } = schema {
            return;
        }
        if let Some(name) = schema.name() {
            if self.0.insert(name.fullname(None), schema).is_some() {
                return;
            }
        }
        match schema {
            Schema::Record(record) => record.fields.iter().for_each(|field| self.collect(&field.schema)),
            Schema::Union(union) => union.variants().iter().for_each(|variant| self.collect(variant)),
            Schema::Array(array) => self.collect(&array.items),
            Schema::Map(map) => self.collect(&map.types),
            _ => {}
        }
    }

    fn deref(&self, schema: &'s Schema) -> Result<&'s Schema, String> {
        match schema {
            Schema::Ref { name } => {
                let full = name.fullname(None);
                self.0.get(&full).copied().ok_or_else(|| format!("unknown type `{full}`"))
            }
            other => Ok(other),
        }
    }
}

/// Resolves `value`, decoded with `writer`, to `reader`.
pub(crate) fn resolve(value: Value, writer: &Schema, reader: &Schema) -> Result<Value, String> {
    let context = Context { writer_names: Names::of(writer), reader_names: Names::of(reader) };
    context.resolve(value, writer, reader)
}

struct Context<'w, 'r> {
    writer_names: Names<'w>,
    reader_names: Names<'r>,
}

impl<'w, 'r> Context<'w, 'r> {
    fn resolve(&self, value: Value, writer: &'w Schema, reader: &'r Schema) -> Result<Value, String> {
        let writer = self.writer_names.deref(writer)?;
        let reader = self.reader_names.deref(reader)?;
        match (writer, reader) {
            (Schema::Union(writer_union), _) => {
                let Value::Union(index, inner) = value else { return Err("expected a union value".into()) };
                let branch = usize::try_from(index)
                    .ok()
                    .and_then(|index| writer_union.variants().get(index))
                    .ok_or_else(|| format!("union branch {index} out of range"))?;
                let branch = self.writer_names.deref(branch)?;
                match reader {
                    Schema::Union(reader_union) => {
                        let (index, reader_branch) = self.branch(branch, reader_union)?;
                        Ok(Value::Union(index, Box::new(self.resolve(*inner, branch, reader_branch)?)))
                    }
                    _ => self.resolve(*inner, branch, reader),
                }
            }
            (_, Schema::Union(reader_union)) => {
                let (index, reader_branch) = self.branch(writer, reader_union)?;
                Ok(Value::Union(index, Box::new(self.resolve(value, writer, reader_branch)?)))
            }
            (Schema::Record(writer_record), Schema::Record(reader_record)) => {
                if writer_record.name.fullname(None) != reader_record.name.fullname(None) {
                    return Err(format!("record `{}` read as `{}`", writer_record.name, reader_record.name));
                }
                let Value::Record(fields) = value else { return Err("expected a record value".into()) };
                let mut fields: HashMap<String, Value> = fields.into_iter().collect();
                let mut resolved = Vec::with_capacity(reader_record.fields.len());
                for field in &reader_record.fields {
                    let written =
                        writer_record.lookup.get(&field.name).and_then(|index| writer_record.fields.get(*index));
                    let value = match (written, fields.remove(&field.name)) {
                        (Some(written), Some(value)) => self.resolve(value, &written.schema, &field.schema)?,
                        _ => match &field.default {
                            Some(default) => self.default(default, &field.schema)?,
                            None => {
                                return Err(format!(
                                    "`{}.{}` has no default and the writer did not write it",
                                    reader_record.name, field.name
                                ))
                            }
                        },
                    };
                    resolved.push((field.name.clone(), value));
                }
                Ok(Value::Record(resolved))
            }
            (Schema::Enum(_), Schema::Enum(reader_enum)) => {
                let Value::Enum(_, symbol) = value else { return Err("expected an enum value".into()) };
                let symbol = if reader_enum.symbols.contains(&symbol) {
                    symbol
                } else {
                    reader_enum.default.clone().ok_or_else(|| format!("symbol `{symbol}` unknown to the reader"))?
                };
                let index = reader_enum.symbols.iter().position(|known| *known == symbol).unwrap_or_default();
                Ok(Value::Enum(u32::try_from(index).map_err(|error| error.to_string())?, symbol))
            }
            (Schema::Array(writer_array), Schema::Array(reader_array)) => {
                let Value::Array(items) = value else { return Err("expected an array value".into()) };
                let items = items
                    .into_iter()
                    .map(|item| self.resolve(item, &writer_array.items, &reader_array.items))
                    .collect::<Result<_, _>>()?;
                Ok(Value::Array(items))
            }
            (Schema::Map(writer_map), Schema::Map(reader_map)) => {
                let Value::Map(entries) = value else { return Err("expected a map value".into()) };
                let entries = entries
                    .into_iter()
                    .map(|(key, value)| Ok((key, self.resolve(value, &writer_map.types, &reader_map.types)?)))
                    .collect::<Result<_, String>>()?;
                Ok(Value::Map(entries))
            }
            // Primitives and logical types (promotions such as int → long): apache-avro is right there.
            (_, reader) => value.resolve(reader).map_err(|error| error.to_string()),
        }
    }

    /// The reader branch a writer branch is read as: the same name for named types, else the same kind,
    /// else the first the writer's type can be promoted to.
    fn branch(&self, writer: &'w Schema, reader: &'r UnionSchema) -> Result<(u32, &'r Schema), String> {
        let writer = self.writer_names.deref(writer)?;
        let mut found = None;
        for (index, variant) in reader.variants().iter().enumerate() {
            let variant = self.reader_names.deref(variant)?;
            let matches = match (writer.name(), variant.name()) {
                (Some(written), Some(read)) => written.fullname(None) == read.fullname(None),
                (None, None) => SchemaKind::from(writer) == SchemaKind::from(variant),
                _ => false,
            };
            if matches {
                found = Some((index, variant));
                break;
            }
        }
        if found.is_none() && writer.name().is_none() {
            found = reader.variants().iter().enumerate().find(|(_, variant)| promotes(writer, variant));
        }
        let (index, variant) =
            found.ok_or_else(|| format!("no reader union branch for {:?}", SchemaKind::from(writer)))?;
        Ok((u32::try_from(index).map_err(|error| error.to_string())?, self.reader_names.deref(variant)?))
    }

    /// A field default (JSON in the schema) as a value of the field's type. A union's default is of its
    /// first branch.
    fn default(&self, default: &Json, schema: &'r Schema) -> Result<Value, String> {
        let schema = self.reader_names.deref(schema)?;
        Ok(match (schema, default) {
            (Schema::Union(union), _) => {
                let first = union.variants().first().ok_or("an empty union")?;
                Value::Union(0, Box::new(self.default(default, first)?))
            }
            (Schema::Null, Json::Null) => Value::Null,
            (Schema::Boolean, Json::Bool(flag)) => Value::Boolean(*flag),
            (Schema::String, Json::String(text)) => Value::String(text.clone()),
            (Schema::Enum(_), Json::String(symbol)) => {
                return self.resolve(Value::Enum(0, symbol.clone()), schema, schema);
            }
            (Schema::Int, Json::Number(number)) => {
                Value::Int(number.as_i64().and_then(|n| i32::try_from(n).ok()).ok_or("an int default")?)
            }
            (Schema::Long, Json::Number(number)) => Value::Long(number.as_i64().ok_or("a long default")?),
            (Schema::TimestampMillis, Json::Number(number)) => {
                Value::TimestampMillis(number.as_i64().ok_or("a timestamp default")?)
            }
            (Schema::Double, Json::Number(number)) => Value::Double(number.as_f64().ok_or("a double default")?),
            (Schema::Array(array), Json::Array(items)) => {
                Value::Array(items.iter().map(|item| self.default(item, &array.items)).collect::<Result<_, _>>()?)
            }
            (Schema::Record(record), Json::Object(object)) => Value::Record(
                record
                    .fields
                    .iter()
                    .map(|field| {
                        let value = object.get(&field.name).or(field.default.as_ref()).ok_or("a record default")?;
                        Ok((field.name.clone(), self.default(value, &field.schema)?))
                    })
                    .collect::<Result<_, String>>()?,
            ),
            (schema, default) => {
                return Err(format!("default {default} for {:?} is not supported", SchemaKind::from(schema)))
            }
        })
    }
}

/// Avro's promotions: int → long, float, double; long → float, double; float → double; string ↔ bytes.
fn promotes(writer: &Schema, reader: &Schema) -> bool {
    matches!(
        (writer, reader),
        (Schema::Int, Schema::Long | Schema::Float | Schema::Double)
            | (Schema::Long, Schema::Float | Schema::Double)
            | (Schema::Float, Schema::Double)
            | (Schema::String, Schema::Bytes)
            | (Schema::Bytes, Schema::String)
    )
}
