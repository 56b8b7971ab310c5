#!/bin/sh
# The image's entrypoint: give the bot a private copy of its SSH key, then run `gpubot ARGS`
# as the bot's user.
#
# A compose file secret keeps the host file's owner and mode, so a 0600 key owned by someone
# else cannot be read by the bot's user. When GPUBOT_SSH_KEY names a file, it is copied to
# /run/gpubot/ssh_key, mode 0600, owned by the bot's user, and GPUBOT_SSH_KEY then names the
# copy. The image starts it as the bot's user (UID 10001), who must be able to read the key;
# started as root (docker run --user 0), it drops to the user gpubot with setpriv after making
# the copy, so a key only root can read still works.
set -eu

key_dir="${GPUBOT_KEY_COPY_DIR:-/run/gpubot}"
user="${GPUBOT_RUN_AS:-gpubot}"
root=false
[ "$(id -u)" = 0 ] && root=true

key="${GPUBOT_SSH_KEY:-}"
if [ -n "$key" ] && [ -e "$key" ]; then
    if [ ! -r "$key" ]; then
        echo "gpubot-entrypoint: cannot read the SSH key $key as UID $(id -u);" \
            "start the container as root (the default) or make the key readable by UID" \
            "$(id -u)" >&2
        exit 2
    fi
    umask 077
    mkdir -p "$key_dir"
    chmod 0700 "$key_dir"
    cp "$key" "$key_dir/ssh_key.tmp"
    chmod 0600 "$key_dir/ssh_key.tmp"
    if $root; then
        chown -R "$user:$(id -g "$user")" "$key_dir"
    fi
    mv -f "$key_dir/ssh_key.tmp" "$key_dir/ssh_key"
    GPUBOT_SSH_KEY="$key_dir/ssh_key"
    export GPUBOT_SSH_KEY
fi

if $root; then
    exec setpriv --reuid="$user" --regid="$(id -g "$user")" --init-groups --inh-caps=-all \
        -- gpubot "$@"
fi
exec gpubot "$@"
