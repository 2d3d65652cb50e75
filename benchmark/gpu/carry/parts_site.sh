# Sourced by the *_parts.sh carry scripts: what each does on the GPU host with its parts.
#   parts_stash PART STASH           copy one carried part's files into STASH
#   parts_install STASH SITE PKG     unpack STASH's archive (*.tar.xz, or its split pieces *.tar.xz.NN, in order)
#                                    into SITE unless SITE/PKG is there, then install STASH's wheels into SITE
parts_stash() {
    mkdir -p "$2" && cp -r "$1"/* "$2"/
    du -sh "$2"
}
parts_install() {
    mkdir -p "$2"
    [ -d "$2/$3" ] || cat "$1"/*.tar.xz* | xz -d -T0 | tar -C "$2" -xf -
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$2" --upgrade "$1"/*.whl
    echo "$(basename "$0"): $2 ready ($(du -sh "$2" | cut -f1))"
}
