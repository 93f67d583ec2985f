"""RouterLab: see and steer dynamic depth (Router-Tuning) in language models, with real skipping."""

from routerlab import spin

spin.set_default()  # before anything below loads torch (routerlab/spin.py)

from routerlab.core.base.config import GenerateConfig, RoutingConfig, default_layers
from routerlab.core.base.errors import RouterLabError
from routerlab.core.decode.engine import Control, Engine
from routerlab.core.model.models import load_model, tiny_model
from routerlab.core.model.anatomy import attach_routers, detach_routers
from routerlab.core.records.trace import Step, Trace, savings
from routerlab.core.routing.router import Router, RouterSet
from routerlab.tuning.checkpoint import load_routers, resolve_routers, save_routers

__all__ = [
    "Control", "Engine", "GenerateConfig", "Router", "RouterLabError", "RouterSet", "RoutingConfig", "Step",
    "Trace", "attach_routers", "default_layers", "detach_routers", "load_model", "load_routers",
    "resolve_routers", "save_routers", "savings", "tiny_model",
]
