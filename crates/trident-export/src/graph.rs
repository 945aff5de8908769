//! A small ONNX graph builder: named inputs and outputs with symbolic axes, initializers
//! from f32/i64/i8 data, and nodes whose outputs get fresh names.

use crate::pb;
use pb::tensor_proto::DataType as Elem;

/// One dimension of a graph input or output.
#[derive(Debug, Clone, PartialEq)]
pub enum Dim {
    /// A fixed size.
    Fixed(i64),
    /// A symbolic size (`batch`, `sequence`).
    Named(&'static str),
}

/// An attribute value.
#[derive(Debug, Clone)]
pub enum Attr {
    Int(i64),
    Float(f32),
    Ints(Vec<i64>),
    Str(&'static str),
}

/// The domain of Microsoft's contrib operators (ONNX Runtime only).
pub const MS_DOMAIN: &str = "com.microsoft";

/// A graph under construction.
#[derive(Default)]
pub struct Graph {
    nodes: Vec<pb::NodeProto>,
    initializers: Vec<pb::TensorProto>,
    inputs: Vec<pb::ValueInfoProto>,
    outputs: Vec<pb::ValueInfoProto>,
    next: usize,
    uses_ms_domain: bool,
}

fn value_info(name: &str, elem: Elem, dims: &[Dim]) -> pb::ValueInfoProto {
    use pb::tensor_shape_proto::{dimension::Value, Dimension};
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d {
                Dim::Fixed(n) => Value::DimValue(*n),
                Dim::Named(s) => Value::DimParam(s.to_string()),
            }),
            denotation: None,
        })
        .collect();
    pb::ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(pb::TypeProto {
            value: Some(pb::type_proto::Value::TensorType(pb::type_proto::Tensor {
                elem_type: Some(elem as i32),
                shape: Some(pb::TensorShapeProto { dim }),
            })),
            denotation: None,
        }),
        ..Default::default()
    }
}

impl Graph {
    /// A new empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    fn fresh(&mut self, hint: &str) -> String {
        self.next += 1;
        format!("{hint}_{}", self.next)
    }

    /// Declares a graph input; returns its name.
    pub fn input(&mut self, name: &str, elem: Elem, dims: &[Dim]) -> String {
        self.inputs.push(value_info(name, elem, dims));
        name.into()
    }

    /// Declares `value` as the graph output `name` (through an Identity when it has
    /// another name).
    pub fn output(&mut self, value: &str, name: &str, elem: Elem, dims: &[Dim]) {
        if value != name {
            self.node_named("Identity", &[value], &[], name);
        }
        self.outputs.push(value_info(name, elem, dims));
    }

    fn tensor(&mut self, name: String, elem: Elem, dims: &[usize], raw: Vec<u8>) -> String {
        self.initializers.push(pb::TensorProto {
            dims: dims.iter().map(|&d| d as i64).collect(),
            data_type: Some(elem as i32),
            name: Some(name.clone()),
            raw_data: Some(raw),
            ..Default::default()
        });
        name
    }

    /// An f32 initializer named `name` (little-endian raw data).
    pub fn weight(&mut self, name: &str, dims: &[usize], data: &[f32]) -> String {
        assert_eq!(
            dims.iter().product::<usize>(),
            data.len(),
            "{name}: shape and data disagree"
        );
        let raw = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor(name.into(), Elem::Float, dims, raw)
    }

    /// An int8 initializer named `name`.
    pub fn weight_i8(&mut self, name: &str, dims: &[usize], data: &[i8]) -> String {
        assert_eq!(
            dims.iter().product::<usize>(),
            data.len(),
            "{name}: shape and data disagree"
        );
        let raw = data.iter().map(|&v| v as u8).collect();
        self.tensor(name.into(), Elem::Int8, dims, raw)
    }

    /// A 1-D int64 constant (shapes, axes, indices).
    pub fn ints(&mut self, values: &[i64]) -> String {
        let name = self.fresh("const");
        let raw = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor(name, Elem::Int64, &[values.len()], raw)
    }

    /// A scalar int64 constant.
    pub fn int_scalar(&mut self, value: i64) -> String {
        let name = self.fresh("const");
        self.tensor(name, Elem::Int64, &[], value.to_le_bytes().to_vec())
    }

    /// A scalar f32 constant.
    pub fn float_scalar(&mut self, value: f32) -> String {
        let name = self.fresh("const");
        self.tensor(name, Elem::Float, &[], value.to_le_bytes().to_vec())
    }

    fn push(
        &mut self,
        domain: &str,
        op: &str,
        inputs: &[&str],
        attrs: &[(&str, Attr)],
        outputs: Vec<String>,
    ) {
        use pb::attribute_proto::AttributeType as T;
        let attribute = attrs
            .iter()
            .map(|(name, a)| {
                let mut p = pb::AttributeProto {
                    name: Some(name.to_string()),
                    ..Default::default()
                };
                match a {
                    Attr::Int(i) => (p.i, p.r#type) = (Some(*i), Some(T::Int as i32)),
                    Attr::Float(f) => (p.f, p.r#type) = (Some(*f), Some(T::Float as i32)),
                    Attr::Ints(v) => (p.ints, p.r#type) = (v.clone(), Some(T::Ints as i32)),
                    Attr::Str(s) => (p.s, p.r#type) = (Some(s.as_bytes().to_vec()), Some(T::String as i32)),
                }
                p
            })
            .collect();
        if !domain.is_empty() {
            self.uses_ms_domain = true;
        }
        let name = self.fresh(op);
        self.nodes.push(pb::NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs,
            name: Some(name),
            op_type: Some(op.into()),
            domain: (!domain.is_empty()).then(|| domain.into()),
            attribute,
            ..Default::default()
        });
    }

    fn node_named(&mut self, op: &str, inputs: &[&str], attrs: &[(&str, Attr)], output: &str) {
        self.push("", op, inputs, attrs, vec![output.into()]);
    }

    /// A standard-domain node with one output; returns the output's name. An empty input
    /// name is an omitted optional input.
    pub fn op(&mut self, op: &str, inputs: &[&str], attrs: &[(&str, Attr)]) -> String {
        let out = self.fresh(&op.to_lowercase());
        self.push("", op, inputs, attrs, vec![out.clone()]);
        out
    }

    /// A node of `domain` with `n` outputs.
    pub fn op_n(
        &mut self,
        domain: &str,
        op: &str,
        inputs: &[&str],
        attrs: &[(&str, Attr)],
        n: usize,
    ) -> Vec<String> {
        let outs: Vec<String> = (0..n).map(|_| self.fresh(&op.to_lowercase())).collect();
        self.push(domain, op, inputs, attrs, outs.clone());
        outs
    }

    /// A com.microsoft node with one output.
    pub fn ms(&mut self, op: &str, inputs: &[&str], attrs: &[(&str, Attr)]) -> String {
        self.op_n(MS_DOMAIN, op, inputs, attrs, 1).remove(0)
    }

    /// Node counts by operator (for reports and tests).
    pub fn histogram(model: &pb::ModelProto) -> std::collections::BTreeMap<String, usize> {
        let mut h = std::collections::BTreeMap::new();
        for n in model.graph.iter().flat_map(|g| &g.node) {
            *h.entry(n.op_type.clone().unwrap_or_default()).or_insert(0) += 1;
        }
        h
    }

    /// The finished model: IR version `ir`, the standard opset `opset` (and com.microsoft
    /// 1 when a contrib operator was used).
    pub fn finish(self, name: &str, ir: i64, opset: i64, doc: String) -> pb::ModelProto {
        let mut opset_import = vec![pb::OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(opset),
        }];
        if self.uses_ms_domain {
            opset_import.push(pb::OperatorSetIdProto {
                domain: Some(MS_DOMAIN.into()),
                version: Some(1),
            });
        }
        pb::ModelProto {
            ir_version: Some(ir),
            opset_import,
            producer_name: Some("trident".into()),
            producer_version: Some(env!("CARGO_PKG_VERSION").into()),
            doc_string: Some(doc),
            graph: Some(pb::GraphProto {
                node: self.nodes,
                name: Some(name.into()),
                initializer: self.initializers,
                input: self.inputs,
                output: self.outputs,
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}
