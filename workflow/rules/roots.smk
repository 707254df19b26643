# Where the report stages write (see the Snakefile index; docs/reproducing.md). Every table, figure and page rule
# renders under a {root}:
#
#   results/reports/   a run's own: its raw folders (results/reports/raw/<study>, collected from results/ by the
#                      raw_* rules) and the tables, figures and page rendered from them
#   reports/           the committed ones, rendered by the same rules from the committed raw folders in
#                      reports/raw/ and reports/provenance.json, which no rule writes (python -m analysis.publish
#                      copies a run's there). Every rendering is deterministic: a clone that re-renders them (its
#                      checkout writes workflow/scripts/ after reports/, so Snakemake finds the scripts newer)
#                      rewrites the same bytes; bin/ci-figures checks it.
#
# The committed reports/ are the default profile's: other profiles render under results/reports/ only.
import sys

from analysis.raw import COMMITTED, DEFAULT_PROFILE, RUN, TABLE_RAW

ROOTS = [RUN, COMMITTED] if config["profile"] == DEFAULT_PROFILE else [RUN]  # {root}'s values (report.smk)

_committed_targets = [a for a in sys.argv[1:] if a.startswith(f"{COMMITTED}/")]
if _committed_targets and config["profile"] != DEFAULT_PROFILE:
    _target = _committed_targets[0]
    stop(f"{_target}: {COMMITTED}/ holds the {DEFAULT_PROFILE} profile's committed evidence; the {config['profile']} "
         f"profile renders its own under {RUN}/ (target {RUN}/{_target[len(COMMITTED) + 1:]})")


# One profile per results/: a run of another profile would replace this one's tables, figures and summaries under
# results/ (their models differ, those paths do not). results/PROFILE names the profile whose run writes there; a run
# of another profile that would write under results/ is refused in one line before any job starts. Dry runs write
# nothing and are not refused; nor is re-rendering the committed reports/ (its jobs write only there).
PROFILE_MARK = Path("results/PROFILE")


onstart:
    _writes = sorted({str(f) for job in workflow.dag.needrun_jobs() for f in job.output if str(f).startswith("results/")})
    _owner = PROFILE_MARK.read_text().strip() if PROFILE_MARK.is_file() else None
    if _writes and _owner not in (None, config["profile"]):
        stop(f"results/ holds a {_owner} profile run (results/PROFILE), which this {config['profile']} run would "
             f"overwrite ({_writes[0]}, ...); run the {config['profile']} profile in a checkout of its own (git "
             f"worktree add ../swiftkv-{config['profile']}) or move results/ away first")
    if _writes:
        PROFILE_MARK.parent.mkdir(exist_ok=True)
        PROFILE_MARK.write_text(f"{config['profile']}\n")


def raw_folder(study):
    """The output of the raw_* rules: the run's raw folder of ``study`` (never the committed one)."""
    return directory(f"{RUN}/raw/{study}")


def raw_params():
    """What collect_raw.py records in a manifest besides the files: the profile, its hash and the --config
    overrides (python -m analysis.publish refuses a run of another profile, or one with overrides)."""
    return dict(config_hash=config_hash(), profile=config["profile"], overrides=dict(workflow.config_settings.config))
