# Shortcuts; the scripts are the source of truth (a fresh machine may not have make).
.PHONY: demo test lint format bench bench-scale generate check-generated rules scenarios dashboards gpu-check kubernetes docs screenshots
demo:
	scripts/demo.sh
test:
	scripts/test.sh
gpu-check:
	scripts/gpu-check.sh
lint:
	.venv/bin/python -m ruff format --check memexporter tests benchmarks && .venv/bin/python -m ruff check memexporter tests benchmarks && .venv/bin/python -m mypy
# Format the code as lint expects it.
format:
	.venv/bin/python -m ruff format memexporter tests benchmarks
bench:
	.venv/bin/python benchmarks/bench_launch.py && .venv/bin/python benchmarks/bench_overhead.py && .venv/bin/python benchmarks/bench_scrape.py && .venv/bin/python benchmarks/bench_trend.py && .venv/bin/python benchmarks/bench_otel.py && .venv/bin/python benchmarks/bench_modules.py && .venv/bin/python benchmarks/bench_phases.py && .venv/bin/python benchmarks/bench_flood.py && .venv/bin/python benchmarks/bench_page.py && OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node=2 benchmarks/bench_fsdp2.py && .venv/bin/python benchmarks/alert_lead_times.py
# Opt-in, not part of bench: Prometheus with 64, 256 and 1,024 simulated ranks, before (as of de4f325)
# and after issue 25; takes tens of minutes. Results in build/bench-scale-*.json and .md.
bench-scale:
	mkdir -p build
	.venv/bin/python benchmarks/bench_scale.py --before --json build/bench-scale-before.json --markdown build/bench-scale-before.md
	.venv/bin/python benchmarks/bench_scale.py --json build/bench-scale-after.json --markdown build/bench-scale-after.md
# Every file generated from a source of truth (memexporter/cli/generate.py's table), or one family.
generate:
	.venv/bin/python -m memexporter.cli.generate
check-generated:
	.venv/bin/python -m memexporter.cli.generate --check
rules:
	.venv/bin/python -m memexporter.cli.generate rules
scenarios:
	.venv/bin/python -m tests.support.scenarios
dashboards:
	.venv/bin/python -m memexporter.cli.generate dashboards
kubernetes:
	.venv/bin/python -m memexporter.cli.generate kubernetes
# The tables in docs/ from their sources, then the site in strict mode (into build/site).
docs:
	.venv/bin/python -m memexporter.cli.generate docs
	NO_MKDOCS_2_WARNING=1 .venv/bin/python -m mkdocs build --strict --site-dir build/site
# The pictures of the live page and of top in docs/, taken again by their test.
screenshots:
	MEMEXPORTER_UPDATE_SCREENSHOTS=1 .venv/bin/python -m pytest -q tests/integration/test_screenshots.py
