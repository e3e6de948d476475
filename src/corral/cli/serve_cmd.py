"""`corral serve`: run the router (FastAPI on uvicorn), the one process users talk to."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Optional

import typer

from corral.errors import ConfigError

__all__ = ["register", "serve"]


def serve(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="TOML config file (see examples/corral.toml)."),
    models_dir: Optional[Path] = typer.Option(None, "--models-dir", help="Every .gguf under it is a model."),
    hf_repo: Optional[str] = typer.Option(
        None, "--hf-repo", "-hf",
        help="A Hub repo: its preset.ini as the presets (user/repo:NAME: that preset), else the model it holds "
             "(user/repo:TAG), pulled when first asked for."),
    models_preset: Optional[Path] = typer.Option(
        None, "--models-preset", help="A llama.cpp preset file (INI): each section one more model."),
    host: Optional[str] = typer.Option(None, "--host", help="Address to listen on [127.0.0.1]."),
    port: Optional[int] = typer.Option(None, "--port", "-p", help="Port [8080]."),
    max_loaded_models: Optional[int] = typer.Option(None, "--max-loaded-models", help="1 = single-GPU mode."),
    memory_budget: Optional[str] = typer.Option(None, "--memory-budget", help="e.g. 8GiB."),
    api_key: Optional[str] = typer.Option(
        None, "--api-key", envvar="CORRAL_API_KEY", show_envvar=True,
        help="Require this key (Authorization: Bearer KEY). Prefer the CORRAL_API_KEY environment "
             "variable: a key on the command line is visible to other local users in the process list."),
    no_autoload: bool = typer.Option(False, "--no-autoload", help="Requests for unloaded models get 400."),
    ctx_len: Optional[int] = typer.Option(None, "--ctx-len", help="Every model: total context (KV cells; unset or 0: 32768 a slot)."),
    n_parallel: Optional[int] = typer.Option(None, "--n-parallel", help="Every model: slots per instance."),
    instances: Optional[int] = typer.Option(None, "--instances", help="Every model: worker processes."),
    threads: Optional[int] = typer.Option(None, "--threads", help="Every model: threads per worker."),
    n_gpu_layers: Optional[str] = typer.Option(
        None, "--n-gpu-layers", "-ngl",
        help="Every model: layers on the GPU (a number, -1 for all, or auto: fit to the GPU's free memory)."),
    cache_type_k: Optional[str] = typer.Option(
        None, "--cache-type-k", "-ctk", help="Every model: KV cache type for K (f16, q8_0, q4_0, ...) [f16]."),
    cache_type_v: Optional[str] = typer.Option(
        None, "--cache-type-v", "-ctv", help="Every model: KV cache type for V; a quantized one needs flash attention."),
    flash_attn: Optional[str] = typer.Option(
        None, "--flash-attn", "-fa", help="Every model: flash attention on, off or auto [auto: llama.cpp decides]."),
    swa_full: bool = typer.Option(
        False, "--swa-full", help="Every model: sliding-window layers keep every cell (more KV, any prefix reusable)."),
    reasoning_format: Optional[str] = typer.Option(
        None, "--reasoning-format",
        help="Every model: thinking markup split from the answer (auto, none, deepseek, harmony, ...) [auto]."),
    reasoning_budget: Optional[int] = typer.Option(
        None, "--reasoning-budget", help="Every model: thinking budget of requests that set none (-1: unlimited) [-1]."),
    ray: Optional[str] = typer.Option(None, "--ray", help="Place model instances on this Ray cluster: auto, HOST:PORT or ray://HOST:10001 (pip install 'corral[ray]')."),
    ray_namespace: Optional[str] = typer.Option(None, "--ray-namespace", help="Ray namespace of the instances' actors [corral]."),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning, error."),
) -> None:
    """Serve models over an OpenAI-compatible HTTP API (no arguments: the embedded default model)."""
    from corral.config.file import CorralConfig, add_pulled_model, load_config

    server_overrides: dict[str, Any] = {
        "host": host, "port": port, "models_dir": str(models_dir) if models_dir else None,
        "models_preset": str(models_preset.resolve()) if models_preset else None,
        "max_loaded_models": max_loaded_models, "memory_budget": memory_budget,
        "api_key": api_key, "autoload": False if no_autoload else None,
        "ray_address": ray, "ray_namespace": ray_namespace,
    }
    model_overrides: dict[str, Any] = {
        "ctx_len": ctx_len, "n_parallel": n_parallel, "instances": instances,
        "threads": threads,
        "n_gpu_layers": n_gpu_layers if n_gpu_layers in (None, "auto") else _int_or_text(n_gpu_layers),
        "cache_type_k": cache_type_k, "cache_type_v": cache_type_v,
        "reasoning_format": reasoning_format, "reasoning_budget": reasoning_budget,
        "swa_full": True if swa_full else None,
    }
    if flash_attn not in (None, "on", "off", "auto"):
        typer.echo(f"corral serve: --flash-attn takes on, off or auto, not {flash_attn!r}", err=True)
        raise typer.Exit(2)
    if flash_attn in ("on", "off"):  # auto: the setting stays unset (llama.cpp decides)
        model_overrides["flash_attn"] = flash_attn == "on"

    pull_model: str | None = None  # -hf of a repo without a preset: its model

    def loader() -> CorralConfig:
        cfg = load_config(config, server_overrides=server_overrides, model_overrides=model_overrides)
        if pull_model is not None:
            add_pulled_model(cfg, pull_model)
        return cfg

    try:
        if hf_repo is not None:  # the Hub's preset.ini, fetched once here (a reload re-reads its copy)
            from corral.state.paths import state_dir
            from corral.store.hub_preset import hub_preset

            found = hub_preset(hf_repo, state_dir(loader().server.state_dir))
            if found.path is not None:
                server_overrides["models_preset"] = str(found.path)
            else:
                pull_model = hf_repo.strip()
        cfg = loader()
    except ConfigError as exc:
        typer.echo(f"corral serve: {exc.message}", err=True)
        raise typer.Exit(2) from None
    if cfg.server.keys_file is not None:  # a broken keys file stops the server here, as a broken config does
        from corral.config.keys_file import read_keys

        try:
            read_keys(cfg.server.keys_file)
        except ConfigError as exc:
            typer.echo(f"corral serve: {exc.message}", err=True)
            raise typer.Exit(2) from None
        if not cfg.server.keys_file.exists():
            typer.echo(f"corral serve: the keys file {cfg.server.keys_file} does not exist yet, so no key "
                       "is accepted; `corral keys add NAME --keys-file PATH` creates it", err=True)
    if cfg.server.ray_address:
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            typer.echo("corral serve: --ray / [server] ray_address needs Ray, which is not installed: "
                       "pip install 'corral[ray]'", err=True)
            raise typer.Exit(2)

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from corral.api.app import create_app
    from corral.api.server import protocol_with_header_timeout
    from corral.api.shutdown import serve as run_server

    app = create_app(cfg, config_loader=loader, handle_sighup=True, freeze_gc=True)
    typer.echo(f"corral: serving on http://{cfg.server.host}:{cfg.server.port}", err=True)
    run_server(app, cfg, log_level=log_level.lower(), http=protocol_with_header_timeout(cfg.server.header_timeout_s))


def register(app: typer.Typer) -> None:
    """Adds this module's commands to the `corral` app."""
    app.command("serve")(serve)


def _int_or_text(value: str) -> int | str:
    """A number stays a number; anything else goes to the settings check, which names it."""
    try:
        return int(value)
    except ValueError:
        return value
