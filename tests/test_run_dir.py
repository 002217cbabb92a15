"""run_dir.environment: the variables that steer vLLM and its JIT compilers, kept beside a run's numbers."""


def test_environment_keeps_the_steering_variables_and_never_the_api_key(monkeypatch):
    from nvfp4stack.run_dir import environment

    monkeypatch.setenv("VLLM_USE_FLASHINFER_SAMPLER", "0")
    monkeypatch.setenv("TRITON_CACHE_DIR", "/tmp/tc")
    monkeypatch.setenv("VLLM_API_KEY", "secret-key")
    monkeypatch.setenv("HOME_OF_SOMETHING_ELSE", "x")
    env = environment({"VLLM_USE_FLASHINFER_SAMPLER": "1", "CUDA_VISIBLE_DEVICES": "1,0", "VLLM_API_KEY": "k2"})
    assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "1"        # engine.env wins: it is what the server sees
    assert env["TRITON_CACHE_DIR"] == "/tmp/tc" and env["CUDA_VISIBLE_DEVICES"] == "1,0"
    assert "VLLM_API_KEY" not in env and "secret-key" not in env.values() and "k2" not in env.values()
    assert "HOME_OF_SOMETHING_ELSE" not in env
    assert list(env) == sorted(env)


def test_environment_hides_the_configured_key_variable_and_secret_looking_names(monkeypatch):
    from nvfp4stack.run_dir import environment

    monkeypatch.setenv("NVFP4STACK_SERVER_KEY", "k3")        # engine.api_key_env may name any variable
    monkeypatch.setenv("VLLM_SOME_TOKEN", "t")
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "INFO")
    env = environment({"NVFP4STACK_PASSWORD": "p"}, secret="NVFP4STACK_SERVER_KEY")
    assert env.get("VLLM_LOGGING_LEVEL") == "INFO"
    assert not {"NVFP4STACK_SERVER_KEY", "VLLM_SOME_TOKEN", "NVFP4STACK_PASSWORD"} & set(env)
