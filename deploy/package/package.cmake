# `make package`: a Debian package built by CPack (docs/deploy.md).
#
#   /usr/bin/prefixd, /usr/bin/prefixctl
#   /usr/lib/systemd/system/prefixd.service     deploy/systemd/prefixd.service
#   /usr/lib/sysusers.d/prefixd.conf            deploy/systemd/prefixd.sysusers
#   /etc/prefixd/config.textproto (conffile)    deploy/config/prefixd.textproto
#   /usr/share/doc/prefixd/                     README.md, docs/*.md, docs/img/
#                                               (the images the docs show)
#
# Depends comes from dpkg-shlibdeps on the binaries: gRPC, protobuf, abseil,
# prometheus-cpp, civetweb (the HTTP listener), libmicrohttpd and GnuTLS
# (the Conductor API's HTTPS), OpenSSL, libzmq5 (the fleet
# index's ZeroMQ; msgpack-cxx is header-only), libcurl4 (Pick's reads of
# the engines' /metrics), libstdc++ and libc, each at
# the version the build saw;
# tests/deploy/package_test.py checks that it covers every library the
# binaries link. Nothing is listed by hand. The maintainer scripts
# create the prefixd user, enable and (re)start the service, and stop it on
# removal, like dh_installsystemd's.
include_guard(GLOBAL)
# Packaging installs what is built; it never builds the rest of the tree
# (`make package` builds first; the package test runs after the build).
set(CMAKE_SKIP_INSTALL_ALL_DEPENDENCY ON)
set(PREFIXD_PKG_DIR ${CMAKE_CURRENT_LIST_DIR})
set(PREFIXD_SRC_DIR ${PROJECT_SOURCE_DIR})

foreach(t prefixd prefixctl)
  if(TARGET ${t})
    install(TARGETS ${t} RUNTIME DESTINATION bin COMPONENT prefixd)
  endif()
endforeach()
install(FILES ${PREFIXD_SRC_DIR}/deploy/systemd/prefixd.service
        DESTINATION lib/systemd/system COMPONENT prefixd)
install(FILES ${PREFIXD_SRC_DIR}/deploy/systemd/prefixd.sysusers
        DESTINATION lib/sysusers.d RENAME prefixd.conf COMPONENT prefixd)
install(FILES ${PREFIXD_SRC_DIR}/deploy/config/prefixd.textproto
        DESTINATION /etc/prefixd RENAME config.textproto COMPONENT prefixd)
file(GLOB PREFIXD_DOCS ${PREFIXD_SRC_DIR}/docs/*.md)
install(FILES ${PREFIXD_SRC_DIR}/README.md ${PREFIXD_DOCS}
        DESTINATION share/doc/prefixd OPTIONAL COMPONENT prefixd)
install(DIRECTORY ${PREFIXD_SRC_DIR}/docs/img
        DESTINATION share/doc/prefixd COMPONENT prefixd)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME prefixd)
set(CPACK_PACKAGE_VENDOR prefixd)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "prefixd maintainers <maintainers@prefixd.invalid>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "prefix-cache index daemon for LLM inference engines")
set(CPACK_PACKAGE_DESCRIPTION
    "prefixd runs beside an LLM inference engine and keeps, per tenant, a radix tree of
token prefixes with the engine's KV block IDs: longest-prefix matches, leases,
LRU eviction under a KV memory budget, RoPE deltas, tenant isolation and
Prometheus metrics. It never holds KV tensors.")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://github.com/prefixd/prefixd")
set(CPACK_STRIP_FILES ON)
configure_file(${PREFIXD_PKG_DIR}/conffiles ${CMAKE_BINARY_DIR}/deb/conffiles COPYONLY)
foreach(script postinst prerm postrm)
  file(COPY ${PREFIXD_PKG_DIR}/${script} DESTINATION ${CMAKE_BINARY_DIR}/deb
       FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE
                        WORLD_READ WORLD_EXECUTE)
endforeach()
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${CMAKE_BINARY_DIR}/deb/conffiles ${CMAKE_BINARY_DIR}/deb/postinst
    ${CMAKE_BINARY_DIR}/deb/prerm ${CMAKE_BINARY_DIR}/deb/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
