use super::*;

#[test]
fn version_policy_selects_directories() {
    let dir = tempfile::tempdir().unwrap();
    for v in ["1", "2", "10", "notaversion"] {
        std::fs::create_dir(dir.path().join(v)).unwrap();
    }
    let mut c = ModelConfig::default();
    assert_eq!(select_versions(dir.path(), &c).unwrap(), vec![10]);
    use pb::model_version_policy::{All, Latest, PolicyChoice, Specific};
    let policy = |p| {
        Some(pb::ModelVersionPolicy {
            policy_choice: Some(p),
        })
    };
    c.version_policy = policy(PolicyChoice::All(All {}));
    assert_eq!(select_versions(dir.path(), &c).unwrap(), vec![1, 2, 10]);
    c.version_policy = policy(PolicyChoice::Latest(Latest { num_versions: 2 }));
    assert_eq!(select_versions(dir.path(), &c).unwrap(), vec![2, 10]);
    c.version_policy = policy(PolicyChoice::Specific(Specific { versions: vec![1, 3] }));
    assert!(select_versions(dir.path(), &c).unwrap_err().contains("version 3"));
}

#[test]
fn control_api_is_refused_outside_explicit_mode_and_names_never_reach_paths() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("m")).unwrap();
    let repo = |mode| {
        Repository::new(RepositoryOptions {
            root: dir.path().into(),
            mode,
            startup_models: vec![],
            cores: 2,
            cache: None,
            onnx_engine: OnnxEngine::Tract,
        })
    };
    assert!(matches!(
        repo(ControlMode::None).load("m"),
        Err(ServeError::NotAllowed(_))
    ));
    let explicit = repo(ControlMode::Explicit);
    for bad in ["../m", "m/..", "/etc", ".", ".."] {
        assert!(
            matches!(explicit.load(bad), Err(ServeError::ModelNotFound(_))),
            "{bad}"
        );
    }
    // `m` exists but has no version: it loads as UNAVAILABLE with a reason.
    let err = explicit.load("m").unwrap_err().to_string();
    assert!(err.contains("no version directory"), "{err}");
    let index = explicit.index(false).unwrap();
    assert_eq!(index[0].state, Some("UNAVAILABLE"));
}
