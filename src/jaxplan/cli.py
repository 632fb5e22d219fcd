"""`jaxplan train ppo --env CartPole-v1 ...`: train, print a line per iteration, write results.

Every iteration's full result goes to `OUTPUT/result.jsonl` (one JSON object per line, RLlib's
keys, plus `seed`); the resolved config to `OUTPUT/params.json`; the run state to
`OUTPUT/checkpoint.msgpack` and `OUTPUT/checkpoints/` (layout: `jaxplan.results`). An earlier
run's files are kept as `NAME.N.SUFFIX`; `--resume DIR` continues the run in DIR. Write errors
exit 1, SIGINT 130, SIGTERM 143, each with one line.
Bad flags and config values are one-line errors (exit 2).
The training loop and the files are `jaxplan.runner.Runner`'s; this module parses and prints.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from jaxplan.algorithms import ALGORITHM_NAMES


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump
        self.exit(2, f"jaxplan: error: {message}\n")


class UsageError(Exception):
    """A bad flag or config value: printed as one line."""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="jaxplan", description="RLlib-style execution plans in JAX.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    train = sub.add_parser("train", help="train an algorithm on a gymnax env")
    train.add_argument("algorithm", choices=ALGORITHM_NAMES)
    train.add_argument(
        "--env",
        default=None,
        help="gymnax env id (default CartPole-v1; sac: Pendulum-v1), MultiAgentCartPole, "
        "jaxmarl:<id>, brax:<name>, jumanji:<id>, a name given to jaxplan.register_env, or "
        "an import path package.module:creator",
    )
    train.add_argument(
        "--stop-timesteps",
        type=int,
        default=None,
        help="stop after this many env steps (default 1,000,000 if no other stop)",
    )
    train.add_argument(
        "--stop-reward",
        type=float,
        default=None,
        help="stop once episode_reward_mean reaches this (each seed on its own)",
    )
    train.add_argument("--stop-iters", type=int, default=None, help="stop after N iterations")
    train.add_argument("--seed", type=int, default=None, help="first seed (default 0)")
    train.add_argument(
        "--num-seeds",
        type=int,
        default=None,
        help="train seeds seed..seed+N-1 in one vmapped program (default 1), split over the "
        "CPU's cores (--cpu-devices) or the devices",
    )
    train.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE|FILE",
        help="config override (dotted keys, JSON values) or a JSON/YAML file; "
        "repeatable, later wins",
    )
    train.add_argument(
        "--no-preset",
        action="store_true",
        help="start from RLlib's defaults instead of the env's tuned preset",
    )
    train.add_argument("--output", type=Path, default=None, help="write result.jsonl here")
    train.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="DIR",
        help="continue the run whose --output was DIR from its checkpoint (its config and "
        "seeds; new stop flags), appending to its result.jsonl",
    )
    train.add_argument(
        "--keep-checkpoints",
        type=int,
        default=3,
        metavar="K",
        help="keep the run state of the last K chunks in OUTPUT/checkpoints/ besides the "
        "latest and the best by episode_reward_mean (default 3; 0: latest and best only)",
    )
    train.add_argument(
        "--report-every",
        type=int,
        default=10,
        metavar="N",
        help="iterations per compiled chunk between host reports (default 10)",
    )
    train.add_argument(
        "--no-compile-cache",
        action="store_true",
        help="do not use the persistent XLA compilation cache",
    )
    train.add_argument(
        "--unrolled-rng",
        action="store_true",
        help="lower jax.random's threefry unrolled in the whole program on the CPU for one "
        "seed too (the rollouts' steps always are, several seeds' whole programs too): the same "
        "numbers; for PPO no faster than the default (jaxplan.fast_rng)",
    )
    train.add_argument(
        "--max-nonfinite-iters",
        type=int,
        default=3,
        metavar="N",
        help="stop (exit 1) after N iterations in a row whose updates were skipped as "
        "non-finite (NaN/inf loss, gradients or params); 0 = never stop (default 3)",
    )
    train.add_argument(
        "--loggers",
        default=None,
        metavar="NAMES",
        help="what --output DIR gets, comma-separated: json (result.jsonl), csv "
        "(progress.csv), tensorboard (tb/seed_S/); 'none' for params and checkpoints only "
        "(default json,csv,tensorboard)",
    )
    train.add_argument(
        "--print-every",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="when stdout is not a terminal (CI logs, pipes): a line for the latest "
        "iteration at most every SECONDS (0: every iteration; default 10); on a terminal a "
        "progress bar",
    )
    train.add_argument(
        "--quiet", action="store_true", help="no progress bar and no per-iteration lines"
    )
    dev = train.add_argument_group(
        "devices and hosts",
        "data-parallel training on a mesh of devices, across processes via jax.distributed",
    )
    dev.add_argument(
        "--num-devices",
        type=int,
        default=None,
        metavar="N",
        help="devices of the data-parallel mesh (config num_devices): 0 = one device, no mesh; "
        "-1 = all devices (the default in a multi-process run)",
    )
    dev.add_argument(
        "--cpu-devices",
        type=int,
        default=None,
        metavar="N",
        help="CPU devices JAX makes of the cores (jaxplan.seed_devices): several seeds split "
        "over them, one program per device (8 seeds on 2 cores: 2x the steps/s); default one "
        "per core for several seeds without a data-parallel mesh, else JAX's (1); 1 = all "
        "seeds in one program on one device; also the devices --num-devices N uses on the CPU",
    )
    dev.add_argument(
        "--coordinator-address",
        default=None,
        metavar="HOST:PORT",
        help="jax.distributed coordinator (else $JAX_COORDINATOR_ADDRESS)",
    )
    dev.add_argument(
        "--num-processes",
        type=int,
        default=None,
        help="processes in the run (else $JAX_NUM_PROCESSES)",
    )
    dev.add_argument(
        "--process-id", type=int, default=None, help="this process's id (else $JAX_PROCESS_ID)"
    )
    dev.add_argument(
        "--distributed-timeout",
        type=_seconds,
        default=60.0,
        metavar="SECONDS",
        help="how long processes wait for each other at start-up, and how long a silent "
        "process may go unnoticed mid-run, before the run stops naming it (default 60)",
    )
    evaluate = sub.add_parser(
        "evaluate", help="play episodes with a run's trained policies (its checkpoint)"
    )
    evaluate.add_argument("directory", type=Path, metavar="DIR", help="the run's --output")
    evaluate.add_argument(
        "--episodes",
        type=int,
        default=None,
        help="episodes per seed (default: the run's evaluation_duration)",
    )
    evaluate.add_argument(
        "--explore",
        action="store_true",
        help="sample actions (default: deterministic, RLlib's explore=False)",
    )
    evaluate.add_argument(
        "--checkpoint",
        default="latest",
        metavar="latest|best|N",
        help="which kept checkpoint: the latest (default), the best by episode_reward_mean, "
        "or that of iteration N",
    )
    evaluate.add_argument("--seed", type=int, default=0, help="key of the episodes (default 0)")
    evaluate.add_argument("--json", action="store_true", help="one JSON result per seed")
    plot = sub.add_parser(
        "plot", help="draw runs' learning curves (mean and min-max band over seeds)"
    )
    plot.add_argument("directories", nargs="+", type=Path, metavar="DIR", help="runs' --output")
    plot.add_argument(
        "--x",
        default="timesteps_total",
        choices=("timesteps_total", "time_total_s", "training_iteration"),
        help="x axis (default timesteps_total)",
    )
    plot.add_argument(
        "--y",
        default="episode_reward_mean",
        metavar="KEY",
        help="result key, dotted for nested ones (evaluation.episode_reward_mean, "
        "info.learner.default_policy.learner_stats.cur_lr; default episode_reward_mean)",
    )
    plot.add_argument(
        "-o", "--output", type=Path, required=True, metavar="FILE", help="FILE.png, .pdf or .svg"
    )
    plot.add_argument("--title", default=None, help="default: the runs' algorithm and env")
    plot.add_argument("--size", default="6.4,4", metavar="W,H", help="inches (default 6.4,4)")
    plot.add_argument("--dpi", type=int, default=100, help="pixels per inch (default 100)")
    plot.add_argument(
        "--per-seed", action="store_true", help="also draw each seed's own curve, thin"
    )
    rollout = sub.add_parser(
        "rollout", help="play episodes with one seed's trained policies, print each return"
    )
    rollout.add_argument("directory", type=Path, metavar="DIR", help="the run's --output")
    rollout.add_argument("--episodes", type=int, default=10, help="episodes (default 10)")
    rollout.add_argument(
        "--checkpoint", default="latest", metavar="latest|best|N", help="as for evaluate"
    )
    rollout.add_argument("--seed", type=int, default=0, help="key of the episodes (default 0)")
    rollout.add_argument(
        "--run-seed",
        type=int,
        default=None,
        help="whose policies, of the run's seeds (default: its first)",
    )
    rollout.add_argument("--explore", action="store_true", help="sample actions")
    rollout.add_argument(
        "--env-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="env parameter over the run's evaluation env config (JSON value), repeatable; "
        "e.g. max_steps_in_episode=100",
    )
    rollout.add_argument(
        "--gif", type=Path, default=None, metavar="OUT.gif", help="animate episode 1 to OUT.gif"
    )
    return parser


def _seconds(text: str) -> float:
    value = float(text)  # argparse reports a ValueError as "invalid _seconds value"
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text}")
    return value


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`["lr=1e-3", "model.fcnet_hiddens=[64,64]", "cfg.yaml"]` -> one flat override dict."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" in item:
            key, _, raw = item.partition("=")
            if not key:
                raise UsageError(f"--config {item!r}: expected KEY=VALUE")
            out[key.strip()] = _parse_value(raw)
        else:
            out.update(_load_file(item))
    return out


def _parse_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        if raw in ("None", "none"):
            return None
        if raw in ("True", "False"):
            return raw == "True"
        return raw


_YAML_FLOAT_AS_STRING = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
"""Exponent floats that YAML 1.1 (PyYAML) reads as strings: `1e-3` (it needs `1.0e-3`)."""


def _load_file(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"--config {path!r}: not KEY=VALUE and no such file")
    text = p.read_text()
    try:
        if p.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"--config {path}:{e.lineno}:{e.colno}: cannot parse: {e.msg}") from None
    except Exception as e:  # noqa: BLE001 - any parse error is the user's file
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        what = " ".join(str(getattr(e, "problem", None) or e).split())  # one line
        context, start = getattr(e, "context", None), getattr(e, "context_mark", None)
        if context and start is not None and mark is not None and start.line != mark.line:
            what = f"{what} ({context} at line {start.line + 1})"
        raise UsageError(f"--config {path}{where}: cannot parse: {what}") from None
    if not isinstance(data, dict):
        raise UsageError(f"--config {path}: expected a mapping of config keys")
    if p.suffix != ".json":
        _refuse_yaml_strings(path, data)
    return data


def _refuse_yaml_strings(path: str, data: Any, key: str = "") -> None:
    """Refuses strings that YAML 1.1 read from what was meant as a number (`lr: 1e-3`)."""
    if isinstance(data, dict):
        for k, v in data.items():
            _refuse_yaml_strings(path, v, f"{key}.{k}" if key else str(k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            _refuse_yaml_strings(path, v, f"{key}[{i}]")
    elif isinstance(data, str) and _YAML_FLOAT_AS_STRING.fullmatch(data):
        mantissa, _, exponent = data.lower().partition("e")
        dotted = mantissa if "." in mantissa else mantissa + ".0"
        raise UsageError(
            f"--config {path}: {key}: {data}: YAML 1.1 reads {data} as a string; write "
            f"{float(data)!r} or {dotted}e{exponent}"
        )


def main(argv: list[str] | None = None) -> int:
    code = _main(argv)
    distributed = sys.modules.get("jaxplan.distributed")  # imported only by a training run
    return distributed.leave(code) if distributed is not None else code


def _main(argv: list[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, or a bad flag (already printed as one line)
        return int(e.code or 0)
    _RECEIVED.clear()
    previous = _on_sigterm(_terminate)
    on_sigint = signal.getsignal(signal.SIGINT)
    try:
        try:
            commands = {"evaluate": _evaluate, "plot": _plot, "rollout": _rollout}
            return commands.get(args.command, _train)(args)
        except Exception as e:  # a missing or lost process of a multi-process run, else re-raised
            distributed = sys.modules.get("jaxplan.distributed")
            msg = distributed.failure_message(e) if distributed is not None else None
            if msg is None:
                raise
            return distributed.stop(f"jaxplan: error: {msg}", distributed.EXIT_LOST)
    except (UsageError, ValueError, KeyError, ImportError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"jaxplan: error: {msg}", file=sys.stderr)
        return 2
    except OSError as e:  # a run file could not be written (the files written stay whole)
        print(f"jaxplan: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("jaxplan: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("jaxplan: terminated (SIGTERM); the files written are whole", file=sys.stderr)
        return 143
    finally:  # _train may have stopped in between deferring and restoring Ctrl-C
        _on_sigterm(previous)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, on_sigint)


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that the run's files are closed whole."""


_RECEIVED: list[int] = []
"""The SIGINT/SIGTERM the handlers below raised for: Python ignores an exception raised in a
callback it calls itself (a gc callback such as XLA's, a `__del__`), so a signal that lands
there would be lost; `_raise_received` raises it again between chunks."""


def _terminate(signum, frame):
    _RECEIVED.append(signum)
    raise Terminated


def _interrupt(signum, frame):
    _RECEIVED.append(signum)
    raise KeyboardInterrupt


def _raise_received() -> None:
    """Raises the stop a signal asked for if its first raise was swallowed (`_RECEIVED`)."""
    if signal.SIGTERM in _RECEIVED:
        raise Terminated
    if signal.SIGINT in _RECEIVED:
        raise KeyboardInterrupt


def _on_sigterm(handler):
    """Installs `handler` for SIGTERM where possible (the main thread); returns the old one."""
    if handler is None or threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, handler)


def _check_args(args) -> None:
    if args.keep_checkpoints < 0:
        raise UsageError(f"--keep-checkpoints must be >= 0, got {args.keep_checkpoints}")
    for flag in ("stop_timesteps", "stop_iters", "num_seeds", "report_every"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    if args.stop_reward is not None and not math.isfinite(args.stop_reward):
        raise UsageError(f"--stop-reward must be finite, got {args.stop_reward}")
    if args.seed is not None and args.seed < 0:
        raise UsageError(f"--seed must be >= 0, got {args.seed}")
    last = (args.seed or 0) + (args.num_seeds or 1) - 1
    if last >= 2**32:
        raise UsageError(
            f"--seed {args.seed} --num-seeds {args.num_seeds or 1}: seeds must be < 2**32 "
            f"({2**32:,}; PRNG keys are uint32), the last would be {last}"
        )
    if args.cpu_devices is not None and args.cpu_devices < 1:
        raise UsageError(f"--cpu-devices must be >= 1, got {args.cpu_devices}")
    if args.max_nonfinite_iters < 0:
        raise UsageError(f"--max-nonfinite-iters must be >= 0, got {args.max_nonfinite_iters}")
    if args.resume is not None and args.output not in (None, args.resume):
        raise UsageError(f"--resume {args.resume} writes to that folder; drop --output")
    if not (math.isfinite(args.print_every) and args.print_every >= 0):
        raise UsageError(f"--print-every must be >= 0 seconds, got {args.print_every}")
    args.loggers = _logger_names(args)


def _logger_names(args) -> list[str] | None:
    """`--loggers json,csv` -> the names, checked (None: the default)."""
    if args.loggers is None:
        return None
    from jaxplan.loggers import LOGGER_NAMES

    text = args.loggers.strip()
    names = [] if text == "none" else [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in LOGGER_NAMES]
    if bad or not text:
        raise UsageError(
            f"--loggers: unknown logger {bad[0] if bad else text!r}; valid: "
            f"{', '.join(LOGGER_NAMES)} (comma-separated) or none"
        )
    if args.output is None and args.resume is None:
        raise UsageError(f"--loggers {args.loggers} writes into --output DIR; add --output")
    return names


def _train(args) -> int:
    _check_args(args)
    overrides = parse_overrides(args.config)
    if args.num_devices is not None:
        overrides["num_devices"] = args.num_devices
    # Config, env and plan are checked before JAX compiles anything.
    from jaxplan import distributed
    from jaxplan.algorithms import get_algorithm

    algorithm = get_algorithm(args.algorithm)
    settings = distributed.resolve_settings(
        args.coordinator_address, args.num_processes, args.process_id
    )
    default_env = algorithm.config_class.env  # CartPole-v1; SAC: Pendulum-v1
    saved = _saved_params(args.resume) if args.resume else None
    if saved is not None:  # the run's own config; flags that change it are refused on resume
        if saved["algorithm"] != algorithm.name:
            raise UsageError(
                f"--resume {args.resume}: that run trained {saved['algorithm']}, not "
                f"{algorithm.name}; use jaxplan train {saved['algorithm'].lower()} --resume ..."
            )
        config = algorithm.config_class.from_dict(saved["config"]).updated(
            {**overrides, **({"env": args.env} if args.env else {})}
        )
        args.output = args.resume
    elif args.no_preset:
        config = algorithm.config_class().updated({**overrides, "env": args.env or default_env})
    else:
        config = algorithm.preset_config(args.env or default_env, overrides)
    if args.stop_timesteps is None and args.stop_iters is None and args.stop_reward is None:
        args.stop_timesteps = 1_000_000
    if saved is not None and args.seed is None and args.num_seeds is None:
        seeds = list(saved["seeds"])
    else:
        first = 0 if args.seed is None else args.seed
        seeds = list(range(first, first + (args.num_seeds or 1)))

    import jax

    multi_process = distributed.initialize(settings, args.distributed_timeout)
    _use_cpu_devices(
        args, len(seeds) > 1 and not multi_process and not config.data_parallel_devices
    )
    if multi_process and "num_devices" not in overrides and config.data_parallel_devices == 0:
        config = config.updated({"num_devices": -1})  # one mesh over every process's devices
    writes = distributed.is_writer()
    from jaxplan.run import Stop
    from jaxplan.runner import NonFiniteTraining, Runner, enable_compile_cache

    interrupts = _defer_interrupts()  # until compiled: XLA must not see a KeyboardInterrupt
    if not args.no_compile_cache and not multi_process:
        enable_compile_cache()
    if args.unrolled_rng:
        from jaxplan.fast_rng import use_unrolled_threefry

        if not use_unrolled_threefry():
            print(
                "jaxplan: --unrolled-rng: not available with this JAX; using its default",
                file=sys.stderr,
            )
    workers = algorithm.build_workers(config)
    plan = algorithm.execution_plan(workers, config)
    stop = Stop(
        episode_reward_mean=args.stop_reward,
        timesteps_total=args.stop_timesteps,
        training_iteration=args.stop_iters,
    )
    params = {"algorithm": algorithm.name, "seeds": seeds, "config": config.to_dict()}
    try:
        runner = Runner(
            plan,
            seeds,
            stop,
            args.report_every,
            args.output,
            params,
            writes,
            resume=args.resume is not None,
            keep_checkpoints=args.keep_checkpoints,
            max_nonfinite_iters=args.max_nonfinite_iters or None,
            loggers=args.loggers,
        )
    except OSError as e:
        raise UsageError(f"--output {args.output}: cannot write results ({e.strerror})") from None
    say = print if writes else _silent
    say(
        f"jaxplan: {algorithm.name} on {config.env} | seeds {seeds[0]}..{seeds[-1]} | "
        f"{workers.num_actor_groups} groups x {workers.num_envs_per_worker} envs x "
        f"{workers.rollout_fragment_length} steps, {algorithm.describe(config)} | "
        f"{_describe_stop(stop)} | {_describe_devices(jax, workers, len(seeds))}",
        flush=True,
    )
    t_compile = runner.compile().compile_s
    _restore_interrupts(interrupts)
    say(f"jaxplan: compiled in {t_compile:.1f} s", flush=True)
    t_start = time.perf_counter()
    warned: set[int] = set()
    progress = _progress(args, stop, seeds) if writes and not args.quiet else None
    try:
        for chunk, results in enumerate(runner):
            for old, new in runner.writer.kept if runner.writer and chunk == 0 else ():
                _say(progress, f"jaxplan: kept the previous run's {old.name} as {new.name}")
            _print_results(args, results, writes, warned, progress, runner.done)
            _raise_received()  # a Ctrl-C / SIGTERM whose exception Python swallowed
    except NonFiniteTraining as e:
        _print_results(args, e.results, writes, warned, progress, runner.done)
        if progress is not None:
            progress.close()
        print(f"jaxplan: error: training is not finite: {e}", file=sys.stderr)
        if runner.writer:
            print(f"jaxplan: the last finite run state is in {runner.writer.checkpoint_path}")
        return 1
    finally:
        if progress is not None:
            progress.close()
    if writes:
        _print_summary(args, runner, time.perf_counter() - t_start, t_compile)
    if runner.writer:
        print(
            f"jaxplan: results in {runner.writer.path}, "
            f"run state in {runner.writer.checkpoint_path} (continue with --resume)"
        )
    return 0


def _evaluate(args) -> int:
    """`jaxplan evaluate DIR`: each seed's trained policies, `--episodes` episodes each."""
    if args.episodes is not None and args.episodes < 1:
        raise UsageError(f"--episodes must be >= 1, got {args.episodes}")
    if not 0 <= args.seed < 2**32:
        raise UsageError(f"--seed must be in [0, 2**32), got {args.seed}")
    from jaxplan.results import finite
    from jaxplan.trained import load_run

    which = int(args.checkpoint) if args.checkpoint.isdigit() else args.checkpoint
    run = load_run(args.directory, which)
    episodes = args.episodes or run.config.evaluation_episodes
    results = run.evaluate(num_episodes=episodes, explore=args.explore, seed=args.seed)
    how = "sampled" if args.explore else "deterministic"
    for r in results:
        if args.json:  # strict JSON: NaN (no finished episode) is null
            print(json.dumps(finite(r), allow_nan=False))
            continue
        print(
            f"jaxplan: seed {r['seed']}: episode_reward_mean {r['episode_reward_mean']:.2f} "
            f"(min {r['episode_reward_min']:.2f}, max {r['episode_reward_max']:.2f}), "
            f"episode_len_mean {r['episode_len_mean']:.1f} over {r['episodes_this_iter']} "
            f"of {episodes} episodes ({how} actions, {run.config.env}, checkpoint of "
            f"iteration {run.iteration})"
        )
    return 0


def _plot(args) -> int:
    """`jaxplan plot DIR ...`: the runs' curves drawn to `-o FILE` (`jaxplan.plot`)."""
    from jaxplan import plot

    try:
        size = tuple(float(v) for v in args.size.split(","))
    except ValueError:
        size = ()
    if len(size) != 2 or not all(math.isfinite(v) and v > 0 for v in size):
        raise UsageError(f"--size {args.size}: expected W,H in inches, e.g. 6.4,4")
    if not 10 <= args.dpi <= 1000:
        raise UsageError(f"--dpi must be in [10, 1000], got {args.dpi}")
    try:
        plot.check_output(args.output)
        curves = plot.load_curves(args.directories, args.x, args.y)
    except ValueError as e:
        raise UsageError(str(e)) from None
    fig = plot.draw(
        curves, args.x, args.y, title=args.title, size=size, dpi=args.dpi, per_seed=args.per_seed
    )
    plot.save(fig, args.output)
    runs = f"{len(curves)} run{'s' if len(curves) > 1 else ''}"
    print(f"jaxplan: {args.y} over {args.x} of {runs} drawn to {args.output}")
    return 0


def _rollout(args) -> int:
    """`jaxplan rollout DIR`: `--episodes` episodes with one run seed's policies, each
    episode's return and length (`TrainedRun.evaluate`'s), and with `--gif` episode 1 drawn."""
    if args.episodes < 1:
        raise UsageError(f"--episodes must be >= 1, got {args.episodes}")
    if not 0 <= args.seed < 2**32:
        raise UsageError(f"--seed must be in [0, 2**32), got {args.seed}")
    env_config = {}
    for item in args.env_config:
        key, eq, raw = item.partition("=")
        if not eq or not key:
            raise UsageError(f"--env-config {item!r}: expected KEY=VALUE")
        env_config[key.strip()] = _parse_value(raw)
    if args.gif is not None:
        if args.gif.suffix.lower() != ".gif":
            raise UsageError(f"--gif {args.gif}: the file name must end in .gif")
        if not args.gif.parent.is_dir():
            raise UsageError(f"--gif {args.gif}: no folder {args.gif.parent}")
    import jax

    from jaxplan.trained import load_run
    from jaxplan.trained_policy import check_env

    which = int(args.checkpoint) if args.checkpoint.isdigit() else args.checkpoint
    run = load_run(args.directory, which)
    seed = run.seeds[0] if args.run_seed is None else args.run_seed
    params = run.seed_params(seed)
    env = run.evaluation_env(env_config)
    for pid in run.plan.workers.policies:
        check_env(run, pid, env)
    if args.gif is not None:
        from jaxplan.render import check_renderable

        check_renderable(env)
    (r,) = run.evaluate(
        num_episodes=args.episodes,
        explore=args.explore,
        seed=args.seed,
        seeds=[seed],
        env_config=env_config,
    )
    how = "sampled" if args.explore else "deterministic"
    print(
        f"jaxplan: {run.config.env}, run seed {seed}'s policies (checkpoint of iteration "
        f"{run.iteration}), {how} actions"
    )
    returns, lengths = r["hist_stats"]["episode_reward"], r["hist_stats"]["episode_lengths"]
    for i, (ret, length) in enumerate(zip(returns, lengths, strict=True)):
        if math.isnan(ret):
            print(f"episode {i + 1:4d}  cut at the step limit (not counted)")
        else:
            print(f"episode {i + 1:4d}  return {ret:10.2f}  length {length:6d}")
    print(
        f"jaxplan: episode_reward_mean {r['episode_reward_mean']:.2f} (min "
        f"{r['episode_reward_min']:.2f}, max {r['episode_reward_max']:.2f}), episode_len_mean "
        f"{r['episode_len_mean']:.1f} over {r['episodes_this_iter']} of {args.episodes} episodes"
    )
    if args.gif is not None:
        from jaxplan.render import record_episode, write_gif

        key = jax.random.fold_in(jax.random.PRNGKey(args.seed), seed)
        states, rets = record_episode(
            run.plan.workers,
            params,
            key,
            num_episodes=args.episodes,
            explore=args.explore,
            env=env,
            filters=run.seed_filters(seed),
        )
        write_gif(env, states, rets, args.gif)
        print(f"jaxplan: wrote {args.gif} ({len(states)} frames: episode 1)")
    return 0


def _progress(args, stop, seeds):
    """A progress bar on stderr when stdout and stderr are terminals, else lines on stdout at
    most every --print-every seconds (`jaxplan.progress`)."""
    from jaxplan.progress import Progress

    interactive = sys.stdout.isatty() and sys.stderr.isatty()
    return Progress(stop, seeds, bar=interactive, every_s=args.print_every, line=_format_line)


def _say(progress, text: str, file=None) -> None:
    """A line that does not break the progress bar."""
    if progress is not None:
        progress.write(text, file=file)
    else:
        print(text, file=file or sys.stdout, flush=True)


def _print_results(
    args, results: list[dict], writes: bool, warned: set[int], progress=None, done=()
) -> None:
    """Progress (bar or lines), and once per seed a warning when the env's rewards are not
    finite (episode_reward_mean is then NaN, written as null)."""
    if not writes:
        return
    for r in results:
        learner = r.get("info", {}).get("learner", {})
        rewards = sum(info.get("num_nonfinite_rewards", 0) for info in learner.values())
        episodes = r.get("episodes_nonfinite", 0)
        if (rewards or episodes) and r["seed"] not in warned:
            warned.add(r["seed"])
            _say(
                progress,
                f"jaxplan: warning: seed {r['seed']}, iteration {r['training_iteration']}: the "
                f"env's rewards are not finite ({rewards} NaN/inf rewards in the train batch, "
                f"{episodes} episodes of the window with a NaN/inf return)",
                file=sys.stderr,
            )
    if progress is not None:
        progress.update(results, done)


def _defer_interrupts() -> bool:
    """Until `_restore_interrupts`, SIGINT (Ctrl-C) is only recorded (`_RECEIVED`): raised
    inside XLA's compiler a KeyboardInterrupt could abort the process or be swallowed. A second
    Ctrl-C exits at once (130). An ignored SIGINT (a shell's background job) stays ignored.
    Returns whether it deferred (what `_restore_interrupts` needs)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        return False

    def record(signum, frame):
        if signal.SIGINT in _RECEIVED:
            os.write(2, b"jaxplan: interrupted\n")
            os._exit(130)
        _RECEIVED.append(signum)

    signal.signal(signal.SIGINT, record)
    return True


def _restore_interrupts(deferred: bool) -> None:
    """Ctrl-C raises KeyboardInterrupt again (and is recorded, `_RECEIVED`); one recorded
    meanwhile raises now. (`_main` puts back the handler it found.)"""
    if not deferred:
        return
    signal.signal(signal.SIGINT, _interrupt)
    if signal.SIGINT in _RECEIVED:
        raise KeyboardInterrupt


def _saved_params(directory: Path) -> dict:
    """The `params.json` of the run in `directory` (its algorithm, seeds and config)."""
    from jaxplan.trained import read_params

    try:
        return read_params(directory)
    except ValueError as e:
        raise UsageError(f"--resume {directory}: {e}") from None


def _silent(*args, **kwargs) -> None:
    pass


def _use_cpu_devices(args, several_seeds: bool) -> None:
    """`--cpu-devices N`, or by default one CPU device per core where several seeds can split
    over them (`jaxplan.seed_devices`): set before JAX's backend starts."""
    from jaxplan.seed_devices import use_cpu_devices

    if args.cpu_devices is None:
        if several_seeds:
            use_cpu_devices()
    elif not use_cpu_devices(args.cpu_devices):
        import jax

        print(
            f"jaxplan: --cpu-devices {args.cpu_devices}: the CPU device count was set already "
            f"(XLA_FLAGS, jax_num_cpu_devices, or JAX had started); using "
            f"{len(jax.devices('cpu'))}",
            file=sys.stderr,
        )


def _describe_devices(jax, workers, seeds: int) -> str:
    backend = jax.default_backend()
    if workers.mesh is None:
        from jaxplan.seed_devices import padded_seeds, seed_mesh

        mesh = seed_mesh(seeds) if seeds > 1 else None
        if mesh is None:
            return f"1 {backend} device"
        each = padded_seeds(seeds, mesh) // mesh.size
        return f"seeds over {mesh.size} {backend} devices ({each} each)"
    n = workers.mesh.size
    where = f" on {jax.process_count()} processes" if jax.process_count() > 1 else ""
    return f"{n} {workers.mesh.devices.flat[0].platform} devices{where} (data-parallel)"


def _describe_stop(stop) -> str:
    parts = []
    if stop.episode_reward_mean is not None:
        parts.append(f"reward >= {stop.episode_reward_mean:g}")
    if stop.timesteps_total is not None:
        parts.append(f"timesteps >= {stop.timesteps_total:,}")
    if stop.training_iteration is not None:
        parts.append(f"iters >= {stop.training_iteration}")
    return "stop: " + " or ".join(parts)


def _format_line(row: list[dict]) -> str:
    r0 = row[0]
    rewards = [r["episode_reward_mean"] for r in row]
    finite = [x for x in rewards if math.isfinite(x)]
    mean = sum(finite) / len(finite) if finite else float("nan")
    line = (
        f"iter {r0['training_iteration']:5d}  timesteps {r0['timesteps_total']:>10,}  "
        f"episode_reward_mean {mean:8.2f}"
    )
    if len(row) > 1:
        line += "  [" + " ".join(f"{x:.1f}" for x in rewards) + "]"
    else:
        line += f"  episode_len_mean {r0['episode_len_mean']:7.2f}"
        per_policy = r0.get("policy_reward_mean") or {}
        if per_policy:  # multi-agent: each policy's return (its agents, summed)
            line += "  [" + " ".join(f"{p} {v:.1f}" for p, v in per_policy.items()) + "]"
    total_rate = sum(r["num_env_steps_sampled_throughput_per_sec"] for r in row)
    line += f"  env_steps/s {total_rate:,.0f}"
    evaluated = [r["evaluation"]["episode_reward_mean"] for r in row if "evaluation" in r]
    evaluated = [x for x in evaluated if math.isfinite(x)]
    if evaluated:  # an evaluation iteration: the mean over seeds of the evaluation return
        line += f"  evaluation {sum(evaluated) / len(evaluated):.2f}"
    return line


def _print_summary(args, runner, total, t_compile) -> None:
    for seed in runner.seeds:
        if seed not in runner.done:
            continue
        r = runner.last[seed]
        reached = args.stop_reward is not None and r["episode_reward_mean"] >= args.stop_reward
        what = (
            f"reached episode_reward_mean {r['episode_reward_mean']:.1f} >= {args.stop_reward:g}"
            if reached
            else f"stopped with episode_reward_mean {r['episode_reward_mean']:.1f}"
        )
        print(
            f"jaxplan: seed {seed}: {what} at {r['timesteps_total']:,} timesteps, "
            f"iteration {r['training_iteration']}"
        )
    print(f"jaxplan: wall time {total + t_compile:.1f} s ({t_compile:.1f} s compile)")


if __name__ == "__main__":
    sys.exit(main())
