// Compile-time comparison of our declarations (third_party/) with a vendor
// header: function types are compared after mapping every enum to its
// underlying integer type (ours and the vendor's are distinct enum types of
// one ABI) and our ncclUniqueId to the vendor's.
#pragma once

#include <tuple>
#include <type_traits>

template <class T, class = void>
struct Canon {
  using type = T;
};
template <class T>
struct Canon<T, std::enable_if_t<std::is_enum<T>::value>> {
  using type = std::underlying_type_t<T>;
};
template <class T>
struct Canon<T*, void> {
  using type = typename Canon<T>::type*;
};
template <class T>
struct Canon<const T*, void> {
  using type = const typename Canon<T>::type*;
};

template <class F>
struct Sig;
template <class R, class... A>
struct Sig<R (*)(A...)> {
  using type = std::tuple<typename Canon<R>::type, typename Canon<A>::type...>;
};

#define HVD_SAME_SIG(ours_fn_type, vendor_fn)                                      \
  static_assert(std::is_same<Sig<ours_fn_type>::type,                              \
                             Sig<decltype(&::vendor_fn)>::type>::value,            \
                #vendor_fn " does not match our declaration")
#define HVD_SAME_VALUE(ours_value, vendor_value)                                   \
  static_assert(static_cast<long long>(ours_value) ==                              \
                    static_cast<long long>(vendor_value),                          \
                #vendor_value " differs")
