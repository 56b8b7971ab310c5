"""The agent's health findings in the reader's language: the agent sends its English text and,
beside it, the English template and its parameters; the bot shows the catalogue's Chinese for
the template with the parameters as sent, and the English as sent when there is no template
(an old agent) or the template is one the catalogue does not know."""

from __future__ import annotations

from agents.checks.common import N_, make, skip_without_nvml
from agents.checks.cuda import check_dev_nodes, check_torch_build
from agents.checks.gpu import check_driver, check_temperature
from agents.checks.security import check_ssh_password_login
from agents.protocol import HealthCheck, HealthReport, NvmlError, from_dict, worst_status
from agents.system import DevNode, DevNodeFacts, SshdConfig
from bot.blocks import instances as render
from bot.i18n import speaking
from bot.services.instances.fleet_views import health_view
from tests.agents.factories import make_probe, make_status
from tests.bot.blocks.slack_limits import all_text, check_message
from tests.bot.blocks.test_instances import inst
from tests.chinese import assert_chinese

PYTHON = "/opt/venv/bin/python"


def findings() -> tuple[HealthCheck, ...]:
    """Checks as the agent writes them: failures and warnings with hints, a skip, a pass."""
    status = make_status(temp_c=96)
    no_nodes = DevNodeFacts(
        control=DevNode("/dev/nvidiactl", False, False),
        gpus=(),
        uvm=DevNode("/dev/nvidia-uvm", False, False),
        dxg=DevNode("/dev/dxg", False, False),
    )
    sshd = SshdConfig(
        path="/etc/ssh/sshd_config",
        found=True,
        settings={"passwordauthentication": "yes"},
        sources={"passwordauthentication": "/etc/ssh/sshd_config.d/50-cloud.conf"},
    )
    broken = make_status(nvml_error=NvmlError("driver_not_loaded", "no driver", "reboot"))
    return (
        check_dev_nodes(no_nodes),
        check_torch_build(
            make_probe(
                torch_installed=False,
                torch_version=None,
                torch_cuda_version=None,
                python_executable=PYTHON,
                python_version="3.11.7",
            ),
            status,
        ),
        check_temperature(status),
        check_ssh_password_login(sshd),
        skip_without_nvml("ecc", broken),
        check_driver(status),
    )


def report_message(checks: tuple[HealthCheck, ...]) -> tuple[str, str]:
    report = HealthReport(status=worst_status(tuple(c.status for c in checks)), checks=checks)
    message = render.health_report(health_view(inst(), report, full=False))
    check_message(message)
    text, blocks = message
    return text, all_text(list(blocks))


def test_the_findings_and_hints_are_chinese_with_their_values() -> None:
    checks = findings()
    assert all(c.summary_template or c.summary_parts for c in checks)
    with speaking("zh"):
        text, shown = report_message(checks)
    assert_chinese(text, shown)
    assert "没有 /dev/nvidia* 设备节点" in shown
    assert f"{PYTHON}（Python 3.11.7）中没有安装 torch" in shown
    assert "`docker run --gpus all`" in shown
    assert f"{PYTHON} -m pip install torch --index-url" in shown
    assert "GPU 过热（" in shown
    assert "96" in shown
    assert "sshd 接受密码登录：" in shown
    assert "/etc/ssh/sshd_config.d/50-cloud.conf" in shown
    assert "`PasswordAuthentication no`" in shown
    assert "已跳过：NVML 无法工作（见 nvml 检查）" in shown


def test_in_english_the_findings_are_shown_as_sent() -> None:
    checks = findings()
    _, shown = report_message(checks)
    assert "no /dev/nvidia* device nodes" in shown
    assert f"torch not installed in {PYTHON} (Python 3.11.7)" in shown
    assert "sshd accepts password logins: " in shown
    for check in checks:
        assert check.summary.split(" ")[0] in shown


def test_an_old_agents_report_without_templates_shows_its_english() -> None:
    old = from_dict(
        HealthReport,
        {
            "status": "fail",
            "checks": [
                {"id": "dev_nodes", "status": "fail", "summary": "no /dev/nvidia* device nodes"},
                {
                    "id": "shm",
                    "status": "warn",
                    "summary": "/dev/shm has 64.0 MiB",
                    "hint": "Start the container with --shm-size=8g.",
                    "details": {},
                },
            ],
        },
    )
    with speaking("zh"):
        text, shown = report_message(old.checks)
    assert "no /dev/nvidia* device nodes" in shown
    assert "/dev/shm has 64.0 MiB" in shown
    assert "Start the container with --shm-size=8g." in shown
    assert "失败" in text


def test_an_unknown_template_or_unfitting_parameters_show_the_english() -> None:
    newer = HealthCheck(
        "new_check",
        "warn",
        "something new on GPU 3",
        summary_template="something new on GPU {index}",
        summary_params={"index": "3"},
    )
    unfitting = HealthCheck(
        "temperature",
        "fail",
        "GPU too hot (GPU 0 at 96 °C)",
        summary_template="GPU too hot ({hot})",
        summary_params={"other": "x"},
    )
    not_text = from_dict(
        HealthCheck,
        {
            "id": "temperature",
            "status": "fail",
            "summary": "GPU too hot (GPU 0 at 96 °C)",
            "summary_template": "GPU too hot ({hot})",
            "summary_params": {"hot": {"nested": 1}},
        },
    )
    with speaking("zh"):
        _, shown = report_message((newer, unfitting, not_text))
    assert "something new on GPU 3" in shown
    assert shown.count("GPU too hot (GPU 0 at 96 °C)") == 2


def test_a_parameter_is_shown_as_given_and_escaped() -> None:
    check = make("dev_nodes", "fail", N_("no read/write access to {unusable}", unusable="<&>"))
    with speaking("zh"):
        _, shown = report_message((check,))
    assert "对 &lt;&amp;&gt; 没有读写权限" in shown
