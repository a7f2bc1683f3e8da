# The devices perfbed's aarch64 QEMU builds in (configure
# --without-default-devices --with-devices-aarch64=perfbed): the `virt`
# board (GICv3, PSCI, PL011, virtio-mmio transports, its device tree) and
# the agent's virtio console, and the device.
CONFIG_ARM_VIRT=y
CONFIG_VIRTIO_SERIAL=y
CONFIG_VIRTIO_MMIO=y
CONFIG_PERFBED=y
# QEMU 7.2's Arm TCG always compiles the M-profile code (target/arm's
# cpu_tcg.c, m_helper.c), which links against the NVIC and semihosting:
# ARM_V7M is `default y if TCG`, which --without-default-devices drops, and
# the link fails without it (armv7m_nvic_set_pending, do_common_semihosting).
CONFIG_ARM_V7M=y
# The GICv3's TCG model (`arm-gicv3`, and its ITS): `default y`, dropped
# the same way; without it `-M virt,gic-version=3` stops at once with
# "unknown type 'arm-gicv3'".
CONFIG_ARM_GICV3_TCG=y
