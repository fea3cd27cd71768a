#!/bin/bash
# Grade a class on a Slurm cluster: one array task per shard, then merge.
#   sbatch --array=1-8 examples/jobs/slurm-array.sh /shared/my-class
#   (when all tasks are done)  .venv/bin/python -m autograder merge /shared/results/shard-* --into /shared/my-class
#SBATCH --job-name=grade-class
#SBATCH --cpus-per-task=4
#SBATCH --mem=8G
#SBATCH --time=02:00:00
set -euo pipefail
COURSE=${1:?course folder on shared storage}
N=${SLURM_ARRAY_TASK_COUNT:?run as an array job}
I=${SLURM_ARRAY_TASK_ID}
cd "${SLURM_SUBMIT_DIR}"
.venv/bin/python -m autograder grade-class --course "$COURSE" --shard "$I/$N" \
    --out "$(dirname "$COURSE")/results/shard-$I" --workers "${SLURM_CPUS_PER_TASK}"
