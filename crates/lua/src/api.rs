//! The `shared` global keymaster adds to the sandbox: the process-wide dictionary (`http`
//! is [`crate::http_client`]).

use bytes::Bytes;
use mlua::{Lua, Table, Value};
use std::sync::Arc;
use std::time::Duration;

use crate::dict::{DictValue, NoMemory, SharedDict};

fn ttl(v: Option<f64>) -> mlua::Result<Option<Duration>> {
    match v {
        None => Ok(None),
        Some(s) if s.is_finite() && s >= 0.0 => Ok(Some(Duration::from_secs_f64(s))),
        Some(_) => Err(mlua::Error::runtime("ttl must be a number of seconds >= 0")),
    }
}

/// Charge the running call for copying `bytes` bytes into or out of the dictionary.
fn charge(bytes: usize) -> mlua::Result<()> {
    crate::meter::charge_bytes(bytes).map_err(mlua::Error::runtime)
}

/// A Lua value as a dictionary value: `None` for nil (`set` then deletes the key).
fn dict_value(v: Value) -> mlua::Result<Option<DictValue>> {
    Ok(Some(match v {
        Value::Integer(i) => DictValue::Number(i as f64),
        Value::Number(n) => DictValue::Number(n),
        Value::String(s) => {
            let bytes = s.as_bytes();
            charge(bytes.len())?;
            DictValue::Text(Bytes::copy_from_slice(&bytes))
        }
        Value::Nil => return Ok(None),
        _ => return Err(mlua::Error::runtime("shared values are numbers or strings")),
    }))
}

const NO_MEMORY: &str = "no memory";

/// `shared.get(k)`, `shared.set(k, v, ttl)` (`true, nil, forcible` or `nil, "no memory"`),
/// `shared.safe_set(k, v, ttl)` (`true` or `nil, "no memory"`), `shared.incr(k, delta,
/// ttl)`, `shared.delete(k)`.
pub(crate) fn shared_table(lua: &Lua, dict: Arc<SharedDict>) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    let d = dict.clone();
    t.set(
        "get",
        lua.create_function(move |lua, k: String| {
            Ok(match d.get(&k) {
                Some(DictValue::Number(n)) => Value::Number(n),
                Some(DictValue::Text(s)) => {
                    charge(s.len())?;
                    Value::String(lua.create_string(s)?)
                }
                None => Value::Nil,
            })
        })?,
    )?;
    let d = dict.clone();
    t.set(
        "set",
        lua.create_function(move |lua, (k, v, t): (String, Value, Option<f64>)| {
            let Some(v) = dict_value(v)? else {
                d.delete(&k);
                return Ok((Value::Boolean(true), Value::Nil, Value::Boolean(false)));
            };
            Ok(match d.set(&k, v, ttl(t)?) {
                Ok(forcible) => (Value::Boolean(true), Value::Nil, Value::Boolean(forcible)),
                Err(NoMemory) => (
                    Value::Nil,
                    Value::String(lua.create_string(NO_MEMORY)?),
                    Value::Nil,
                ),
            })
        })?,
    )?;
    let d = dict.clone();
    t.set(
        "safe_set",
        lua.create_function(move |lua, (k, v, t): (String, Value, Option<f64>)| {
            let Some(v) = dict_value(v)? else {
                d.delete(&k);
                return Ok((Value::Boolean(true), Value::Nil));
            };
            Ok(match d.safe_set(&k, v, ttl(t)?) {
                Ok(()) => (Value::Boolean(true), Value::Nil),
                Err(NoMemory) => (Value::Nil, Value::String(lua.create_string(NO_MEMORY)?)),
            })
        })?,
    )?;
    let d = dict.clone();
    t.set(
        "incr",
        lua.create_function(
            move |_, (k, delta, t): (String, Option<f64>, Option<f64>)| {
                d.incr(&k, delta.unwrap_or(1.0), ttl(t)?)
                    .map_err(mlua::Error::runtime)
            },
        )?,
    )?;
    let d = dict;
    t.set(
        "delete",
        lua.create_function(move |_, k: String| {
            d.delete(&k);
            Ok(())
        })?,
    )?;
    Ok(t)
}
