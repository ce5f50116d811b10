"""Before an Engine serves, by job: assembly with no forward pass (`sizing`: memory sized,
pool made, disk tier opened; `Engine.__init__`), the forward passes that check and warm the
model (`checks`; `Engine.create` runs them after assembly, handing them the parts they need and
itself as a `checks.Serving`). A vision model's image side is the engine's own
(`Engine.open_vision`, from `Engine.from_path`). The names the engine uses are here; nothing
here imports the engine."""

from worker.engine.startup.checks import Serving as Serving
from worker.engine.startup.checks import check_model as check_model
from worker.engine.startup.checks import kv_groups as kv_groups
from worker.engine.startup.checks import run_alone as run_alone
from worker.engine.startup.checks import run_together as run_together
from worker.engine.startup.checks import verify_greedy as verify_greedy
from worker.engine.startup.checks import warm_up as warm_up
from worker.engine.startup.sizing import apply_memory_plan as apply_memory_plan
from worker.engine.startup.sizing import kept_prefix_bytes as kept_prefix_bytes
from worker.engine.startup.sizing import kv_quantization as kv_quantization
from worker.engine.startup.sizing import make_pool as make_pool
from worker.engine.startup.sizing import open_disk_tier as open_disk_tier
from worker.engine.startup.sizing import size_memory as size_memory
from worker.engine.startup.sizing import window_layout as window_layout
